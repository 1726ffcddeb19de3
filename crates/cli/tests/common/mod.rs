//! Test support: start the real binary on loopback and speak JSON-RPC to it.
#![allow(dead_code)]

pub mod cut_proxy;
pub mod loopback_http;
pub mod sandbox;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as Ws;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const BIN: &str = env!("CARGO_BIN_EXE_exec-server");

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .unwrap_or_default()
}

/// The first line `child` writes on its piped stdout (a server's URL),
/// without its line end; the rest of stdout is left unread.
pub fn first_stdout_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("a first line on stdout");
    line.trim().to_string()
}

/// A server process; killed (by PID) when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    /// Starts our binary with `extra` flags, or, when `EXEC_SERVER_TEST_SERVER_CMD`
    /// is set (differential runs against the reference), that command as is.
    pub fn start(extra: &[&str]) -> Server {
        let cmd = match std::env::var("EXEC_SERVER_TEST_SERVER_CMD") {
            Ok(line) => {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let mut c = Command::new(parts[0]);
                c.args(&parts[1..]);
                c
            }
            Err(_) => {
                let mut c = server_command(BIN);
                c.args(["--listen", "ws://127.0.0.1:0"]).args(extra);
                c
            }
        };
        Server::spawn(cmd)
    }

    /// Starts `cmd` (a server told to listen on `ws://127.0.0.1:0`, set up
    /// as the caller needs) and waits for its URL.
    pub fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start exec-server");
        let line = first_stdout_line(&mut child);
        assert!(
            line.starts_with("ws://127.0.0.1:"),
            "first stdout line: {line:?}"
        );
        Server { child, url: line }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first so the server kills the process trees it started; SIGKILL
        // only if it does not exit.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON-RPC connection over WebSocket that buffers unmatched messages.
pub struct Conn {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    buffered: VecDeque<Value>,
    next_id: i64,
    pub session: String,
}

pub const WAIT: Duration = Duration::from_secs(10);

impl Conn {
    pub async fn connect(url: &str) -> Conn {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        Conn {
            ws,
            buffered: VecDeque::new(),
            next_id: 100,
            session: String::new(),
        }
    }

    /// Connects, initializes (optionally resuming) and sends `initialized`.
    pub async fn open(url: &str, resume: Option<&str>) -> Conn {
        let mut c = Conn::connect(url).await;
        let mut params = json!({"clientName": "test"});
        if let Some(r) = resume {
            params["resumeSessionId"] = json!(r);
        }
        let r = c.call("initialize", params).await;
        c.session = r["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("initialize failed: {r}"))
            .to_string();
        c.notify("initialized", Value::Null).await;
        c
    }

    pub async fn send_raw(&mut self, text: String) {
        self.ws.send(Ws::text(text)).await.expect("send");
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        let mut m = json!({"method": method});
        if !params.is_null() {
            m["params"] = params;
        }
        self.send_raw(m.to_string()).await;
    }

    /// Sends a request and returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send_raw(json!({"id": id, "method": method, "params": params}).to_string())
            .await;
        id
    }

    /// Sends a request and waits for its response (whole envelope).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.response(id).await
    }

    /// `result` of a call, panicking on an error.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params).await;
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        r["result"].clone()
    }

    pub async fn response(&mut self, id: i64) -> Value {
        self.expect(|m| m["id"] == json!(id), WAIT)
            .await
            .unwrap_or_else(|| panic!("no response to {id}"))
    }

    async fn recv(&mut self, timeout: Duration) -> Option<Value> {
        match tokio::time::timeout(timeout, self.ws.next()).await {
            Ok(Some(Ok(Ws::Text(t)))) => serde_json::from_str(t.as_str()).ok(),
            Ok(Some(Ok(_))) => Some(Value::Null),
            _ => None,
        }
    }

    /// Waits for the first message matching `pred` (earlier buffered ones first).
    pub async fn expect(
        &mut self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<Value> {
        if let Some(i) = self.buffered.iter().position(&pred) {
            return self.buffered.remove(i);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let m = self.recv(left).await?;
            if pred(&m) {
                return Some(m);
            }
            self.buffered.push_back(m);
        }
    }

    /// `result` of a call, dropping every notification that arrives before
    /// the response (for output too large to buffer in a test).
    pub async fn ok_dropping_notifications(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.buffered.retain(|m| m.get("method").is_none());
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no response to {method}"));
            let m = self
                .recv(left)
                .await
                .unwrap_or_else(|| panic!("no response to {method}"));
            if m["id"] == json!(id) {
                assert!(m.get("error").is_none(), "{method} failed: {m}");
                return m["result"].clone();
            }
        }
    }

    /// True if the server closed the connection within `timeout`.
    pub async fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            match tokio::time::timeout(left, self.ws.next()).await {
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Ws::Close(_)))) => return true,
                Ok(Some(Ok(Ws::Text(t)))) => self
                    .buffered
                    .push_back(serde_json::from_str(t.as_str()).unwrap_or(Value::Null)),
                Ok(Some(Ok(_))) => {}
                Err(_) => return false,
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }

    /// Notifications of `pid` until `process/closed`: (bytes, exit code, events in order).
    pub async fn collect(&mut self, pid: &str, timeout: Duration) -> Collected {
        let mut c = Collected::default();
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_default();
            let m = self
                .expect(
                    |m| {
                        m["params"]["processId"] == json!(pid)
                            && m["method"]
                                .as_str()
                                .is_some_and(|s| s.starts_with("process/"))
                    },
                    left,
                )
                .await
                .unwrap_or_else(|| {
                    panic!("process {pid}: no closed within {timeout:?}; got {c:?}")
                });
            let seq = m["params"]["seq"].as_u64().unwrap_or(0);
            c.seqs.push(seq);
            match m["method"].as_str() {
                Some("process/output") => c.bytes.extend(unb64(&m["params"]["chunk"])),
                Some("process/exited") => {
                    c.exit = m["params"]["exitCode"].as_i64();
                    c.exit_seq = seq;
                    c.limit = m["params"]["limit"].as_str().map(str::to_string);
                    c.signal = m["params"]["signal"].as_str().map(str::to_string);
                }
                Some("process/closed") => {
                    c.closed_seq = seq;
                    return c;
                }
                _ => {}
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct Collected {
    pub bytes: Vec<u8>,
    pub exit: Option<i64>,
    /// `limit` of `process/exited` (ours), when one fired.
    pub limit: Option<String>,
    /// `signal` of `process/exited` (ours), when a signal ended it.
    pub signal: Option<String>,
    pub exit_seq: u64,
    pub closed_seq: u64,
    pub seqs: Vec<u64>,
}

/// `program` (a build of this server) as a command whose record of the
/// directories sandboxes could write (`$XDG_STATE_HOME/exec-server/…`) is
/// its own: one test's sandboxes never make another test's symlinks
/// untrusted.
pub fn server_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env("XDG_STATE_HOME", tmpdir("state"));
    c
}

pub fn tmpdir(tag: &str) -> std::path::PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_tmpdirs);
    let d = std::env::temp_dir().join(format!(
        "es-test-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes the directories earlier test processes left (`es-test-TAG-PID-N`
/// whose PID is gone): sandboxes that may write `/tmp` scan it for nested
/// repositories, so a `/tmp` full of old fixtures slows every such start.
fn sweep_tmpdirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("es-test-")) else {
            continue;
        };
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

pub fn uri(p: &std::path::Path) -> String {
    format!("file://{}", p.display())
}

/// Typed `process/start` params for the client library: pipes, cwd /tmp, a minimal PATH.
pub fn exec_params(id: &str, argv: &[&str]) -> exec_server_protocol::types::ExecParams {
    exec_server_protocol::types::ExecParams::new(
        id,
        argv.iter().map(|s| s.to_string()).collect(),
        exec_server_protocol::PathUri::parse("file:///tmp").unwrap(),
        [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
    )
}

/// `process/start` params in the field-case convention.
pub fn start_params(
    id: &str,
    argv: &[&str],
    cwd: &std::path::Path,
    tty: bool,
    pipe_stdin: bool,
) -> Value {
    json!({"processId": id, "argv": argv, "cwd": uri(cwd), "env": {"PATH": "/usr/bin:/bin"}, "tty": tty, "pipeStdin": pipe_stdin})
}

/// Pids of processes whose command line contains `needle` (tree check).
pub fn pids_matching(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let me = std::process::id() as i32;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| stat[i + 1..].to_string()) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 1 && f[0] == "Z" && f[1] == parent.to_string() {
            out.push(pid);
        }
    }
    out
}

/// Polls `cond` every 50 ms until true or `timeout` (for OS state with no event to await).
pub async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// `process/read` from `after`, long-polling up to `wait_ms`.
pub async fn read(c: &mut Conn, pid: &str, after: u64, wait_ms: u64) -> Value {
    c.ok(
        "process/read",
        json!({"processId": pid, "afterSeq": after, "waitMs": wait_ms}),
    )
    .await
}

/// The first `fs/changed` naming the path `target` (a URI) within [`WAIT`].
pub async fn expect_fs_changed(c: &mut Conn, target: &str) -> Option<Value> {
    c.expect(
        |m| {
            m["method"] == "fs/changed"
                && m["params"]["paths"]
                    .as_array()
                    .is_some_and(|p| p.contains(&json!(target)))
        },
        WAIT,
    )
    .await
}

/// Asserts that no process matching `needle` is left within 3 s.
pub async fn assert_gone(needle: &str) {
    assert!(
        eventually(Duration::from_secs(3), || pids_matching(needle).is_empty()).await,
        "`{needle}` survived: {:?}",
        pids_matching(needle)
    );
}

impl Conn {
    /// Resumes `session`, retrying while the server still sees the old connection.
    pub async fn open_retry(url: &str, session: &str) -> Conn {
        for _ in 0..50 {
            let mut c = Conn::connect(url).await;
            let r = c
                .call(
                    "initialize",
                    json!({"clientName": "t", "resumeSessionId": session}),
                )
                .await;
            if r.get("result").is_some() {
                c.session = session.to_string();
                c.notify("initialized", Value::Null).await;
                return c;
            }
            assert_eq!(r["error"]["code"], json!(-32010), "{r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("could not resume {session}");
    }
}

/// Every entry below `dir` with its kind, bytes or link target and mode,
/// sorted: compare two to prove a tree unchanged.
pub fn snapshot(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let what = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p);
                "dir".to_string()
            } else {
                format!("file {:?}", std::fs::read(&p).unwrap())
            };
            out.push(format!("{rel} {what} {:o}", m.mode()));
        }
    }
    out.sort();
    out
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`…), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Open file descriptors of `pid` (entries of `/proc/PID/fd`).
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Threads of `pid` (entries of `/proc/PID/task`).
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// inotify instances `pid` holds (its fds that link to `anon_inode:inotify`).
pub fn inotify_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy() == "anon_inode:inotify")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Kernel watches held by `pid`'s inotify instances (`inotify wd:` lines of
/// their `/proc/PID/fdinfo`).
pub fn inotify_watch_count(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:inotify")
        })
        .map(|e| {
            std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count()
        })
        .sum()
}

/// True while `pid` runs (not exited, not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s[s.rfind(')')? + 1..].trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// What `seq 1 n` prints.
pub fn expected_seq(n: u64) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.extend_from_slice(format!("{i}\n").as_bytes());
    }
    v
}

/// The first byte where `got` and `want` differ, for a readable failure.
pub fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then(|| got.len().min(want.len())))
}
