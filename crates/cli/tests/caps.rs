//! Memory, task and CPU caps (`limits.memoryBytes`, `maxTasks`,
//! `cpuPercent`) against the real binary: each holds for the whole tree, on
//! pipes, on a PTY and in the sandbox, and names itself when it fires;
//! where a cap cannot hold it is refused, never pretended. Also the
//! server's `--default-limits`/`--max-limits` and the ending signal's name.

use crate::common;
use crate::limits::run_limited as run;
use common::sandbox::ro;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Python that allocates and touches 4 GiB.
const ALLOCATE_4G: &str = "x = b'a' * (4 << 30); print('survived')";

/// Python that forks children that sleep until it has forked 200 or a fork
/// is refused, then prints how it ended and how many it made.
const FORK_MANY: &str = "import os, time
kids = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError as e:
        print('refused', e.errno)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids += 1
print('kids', kids, flush=True)";

/// Python that spins for one second of wall time and prints the CPU
/// seconds it got.
const SPIN_1S: &str = "import time
t = time.time(); c = time.process_time()
while time.time() - t < 1: pass
print(round(time.process_time() - c, 3))";

async fn capabilities(s: &Server) -> Value {
    let mut c = Conn::open(&s.url, None).await;
    let info = c.ok("environment/info", Value::Null).await;
    c.close().await;
    info["capabilities"].clone()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The three kinds of process: pipes, PTY, sandbox (read-only).
fn kinds(ws: &std::path::Path) -> [(bool, Option<Value>); 3] {
    [(false, None), (true, None), (false, Some(ro(ws)))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_gib_allocation_under_256_mib_ends_with_memory_limit() {
    let s = Server::start(&[]);
    let caps = capabilities(&s).await;
    assert_eq!(
        caps["processMemoryLimit"],
        json!(true),
        "this host has a memory controller (v1 or delegated v2): {caps}"
    );
    let before = rss_kib(s.child.id());
    let ws = tmpdir("caps-mem");
    for (tty, sandbox) in kinds(&ws) {
        let (got, took) = run(
            &s,
            &["python3", "-c", ALLOCATE_4G],
            json!({"memoryBytes": 256 << 20}),
            tty,
            sandbox.clone(),
        )
        .await;
        let what = format!("tty {tty}, sandbox {}", sandbox.is_some());
        assert_eq!(got.limit.as_deref(), Some("memoryLimit"), "{what}: {got:?}");
        assert_eq!(got.exit, Some(137), "{what}");
        assert!(
            !String::from_utf8_lossy(&got.bytes).contains("survived"),
            "{what}"
        );
        assert!(took < 20.0, "{what}: took {took:.1} s");
    }
    let after = rss_kib(s.child.id());
    assert!(
        after < before + 64 * 1024,
        "the server's own memory grew from {before} KiB to {after} KiB"
    );
    let _ = std::fs::remove_dir_all(&ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_past_the_task_cap_are_refused_and_the_tree_ends_with_tasks_limit() {
    let s = Server::start(&[]);
    assert_eq!(capabilities(&s).await["processTasksLimit"], json!(true));
    let ws = tmpdir("caps-tasks");
    for (tty, sandbox) in kinds(&ws) {
        let what = format!("tty {tty}, sandbox {}", sandbox.is_some());
        let (got, took) = run(
            &s,
            &["python3", "-c", FORK_MANY],
            json!({"maxTasks": 32}),
            tty,
            sandbox.clone(),
        )
        .await;
        let out = String::from_utf8_lossy(&got.bytes).to_string();
        assert!(out.contains("refused 11"), "{what}: EAGAIN expected: {out}");
        let kids: u32 = out
            .split("kids ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: {out}"));
        assert!(kids < 32, "{what}: {kids} children under a cap of 32");
        assert_eq!(got.limit.as_deref(), Some("tasksLimit"), "{what}");
        // The children sleep 60 s; the tree was ended at the exit.
        assert!(took < 15.0, "{what}: took {took:.1} s");
    }
    let _ = std::fs::remove_dir_all(&ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_under_64_tasks_is_contained_and_the_server_keeps_answering() {
    let s = Server::start(&[]);
    let d = tmpdir("caps-bomb");
    let mut bomb = Conn::open(&s.url, None).await;
    let mut params = start_params(
        "bomb",
        &["bash", "-c", "b() { b | b & }; b; sleep 1000"],
        &d,
        false,
        false,
    );
    params["limits"] = json!({"maxTasks": 64, "timeoutMs": 3000});
    bomb.ok("process/start", params).await;
    // Meanwhile another session starts and finishes a command.
    let mut other = Conn::open(&s.url, None).await;
    for i in 0..3 {
        let id = format!("echo{i}");
        let t = Instant::now();
        other
            .ok(
                "process/start",
                start_params(&id, &["echo", "alive"], &d, false, false),
            )
            .await;
        let got = other.collect(&id, Duration::from_secs(10)).await;
        assert_eq!(got.bytes, b"alive\n");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "answered in {:?}",
            t.elapsed()
        );
    }
    let got = bomb.collect("bomb", Duration::from_secs(30)).await;
    assert_eq!(got.limit.as_deref(), Some("wallTimeout"), "{got:?}");
    other.close().await;
    bomb.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_cap_slows_the_tree() {
    let s = Server::start(&[]);
    assert_eq!(capabilities(&s).await["processCpuLimit"], json!(true));
    let (got, _) = run(
        &s,
        &["python3", "-c", SPIN_1S],
        json!({"cpuPercent": 20}),
        false,
        None,
    )
    .await;
    let cpu: f64 = String::from_utf8_lossy(&got.bytes).trim().parse().unwrap();
    assert!(
        cpu < 0.5,
        "{cpu} CPU seconds in one second under a 20 % cap"
    );
    assert_eq!(got.limit, None, "a CPU cap slows, never ends");
}

#[tokio::test]
async fn without_cgroups_a_cap_is_refused_and_not_advertised() {
    let s = Server::start(&["--process-cgroups", "off"]);
    let caps = capabilities(&s).await;
    for key in ["processMemoryLimit", "processTasksLimit", "processCpuLimit"] {
        assert_eq!(caps[key], json!(false), "{key}");
    }
    let d = tmpdir("caps-off");
    let mut c = Conn::open(&s.url, None).await;
    for (limits, member) in [
        (json!({"memoryBytes": 256 << 20}), "memoryBytes"),
        (json!({"maxTasks": 10}), "maxTasks"),
        (json!({"cpuPercent": 50}), "cpuPercent"),
    ] {
        let mut params = start_params("x", &["true"], &d, false, false);
        params["limits"] = limits;
        let r = c.call("process/start", params).await;
        assert_eq!(r["error"]["code"], json!(-32602), "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&format!("limits.{member} cannot be held")),
            "{msg}"
        );
    }
    c.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_defaults_fill_in_and_ceilings_cap_and_refuse_a_raise() {
    let s = Server::start(&[
        "--default-limits",
        "timeout=700ms",
        "--max-limits",
        "max-output=1K,timeout=10s",
    ]);
    let (got, took) = run(&s, &["sleep", "1000"], Value::Null, false, None).await;
    assert_eq!(
        got.limit.as_deref(),
        Some("wallTimeout"),
        "the default deadline"
    );
    assert!(took < 4.0, "took {took:.1} s");
    let (got, _) = run(&s, &["yes"], Value::Null, false, None).await;
    assert_eq!(
        got.limit.as_deref(),
        Some("outputLimit"),
        "the ceiling applies"
    );
    assert_eq!(got.bytes.len(), 1024);
    let (got, _) = run(&s, &["yes"], json!({"maxOutputBytes": 100}), false, None).await;
    assert_eq!(got.bytes.len(), 100, "a request lowers a ceiling");
    let d = tmpdir("caps-ceiling");
    let mut c = Conn::open(&s.url, None).await;
    let mut params = start_params("x", &["true"], &d, false, false);
    params["limits"] = json!({"maxOutputBytes": 2048});
    let r = c.call("process/start", params).await;
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    assert_eq!(
        r["error"]["message"],
        json!("limits.maxOutputBytes (2048) is above this server's ceiling (1024, --max-limits)")
    );
    c.close().await;
    let _ = std::fs::remove_dir_all(&d);
    // A default above its ceiling stops the server before it serves.
    let bad = crate::common::server_command(BIN)
        .args([
            "--listen",
            "ws://127.0.0.1:0",
            "--default-limits",
            "timeout=1m",
            "--max-limits",
            "timeout=10s",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--default-limits") && err.contains("ceiling"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_that_ended_a_process_is_named() {
    let s = Server::start(&[]);
    let (got, _) = run(&s, &["sh", "-c", "kill -KILL $$"], Value::Null, false, None).await;
    assert_eq!(
        (got.exit, got.signal.as_deref()),
        (Some(137), Some("SIGKILL"))
    );
    let (got, _) = run(&s, &["sh", "-c", "exit 137"], Value::Null, false, None).await;
    assert_eq!(
        (got.exit, got.signal),
        (Some(137), None),
        "an exit is not a signal"
    );
    let (got, _) = run(
        &s,
        &["sleep", "1000"],
        json!({"timeoutMs": 200}),
        false,
        None,
    )
    .await;
    assert_eq!(got.signal.as_deref(), Some("SIGTERM"));
}

/// (first seq, bytes) of what `process/read` can still return of `id`.
async fn retained(c: &mut Conn, id: &str) -> (u64, u64) {
    let (mut after, mut first, mut bytes) = (0u64, 0u64, 0u64);
    for _ in 0..1000 {
        let r = c
            .ok_dropping_notifications(
                "process/read",
                json!({"processId": id, "afterSeq": after, "waitMs": 0}),
            )
            .await;
        for chunk in r["chunks"].as_array().unwrap() {
            let seq = chunk["seq"].as_u64().unwrap();
            if first == 0 {
                first = seq;
            }
            after = seq;
            bytes += unb64(&chunk["chunk"]).len() as u64;
        }
        if r["closed"] == json!(true) || r["chunks"].as_array().unwrap().is_empty() {
            break;
        }
    }
    (first, bytes)
}

/// A session's share of the spool: one that floods keeps at most its
/// share (plus the 1 MiB memory window) and another keeps all of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_flood_keeps_its_share_of_the_spool_and_spares_another() {
    let d = tmpdir("caps-spool");
    let s = Server::start(&[
        "--output-spool-dir",
        d.join("s").to_str().unwrap(),
        "--output-spool-session-bytes",
        "4194304",
    ]);
    let mut flood = Conn::open(&s.url, None).await;
    let mut calm = Conn::open(&s.url, None).await;
    for (c, id, mib) in [(&mut flood, "flood", 12u64), (&mut calm, "calm", 3)] {
        let cmd = format!("head -c {} /dev/zero", mib << 20);
        c.ok(
            "process/start",
            start_params(id, &["sh", "-c", &cmd], &d, false, false),
        )
        .await;
        let got = c.collect(id, Duration::from_secs(30)).await;
        assert_eq!(got.bytes.len() as u64, mib << 20, "{id}: pushed whole");
    }
    let (first, kept) = retained(&mut flood, "flood").await;
    assert!(first > 1, "the flood's oldest output was dropped");
    assert!(
        (2 << 20..=6 << 20).contains(&kept),
        "the flood keeps its 4 MiB share and the window, not {kept} bytes"
    );
    let (first, kept) = retained(&mut calm, "calm").await;
    assert_eq!((first, kept), (1, 3 << 20), "the other session keeps all");
    flood.close().await;
    calm.close().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// The limits the `limits` module checks on pipes, here on a PTY and in the
/// sandbox too: an idle timeout, an output cap, and a deadline that takes a
/// double-forked daemon ignoring SIGTERM with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_output_and_deadline_limits_hold_on_a_pty_and_in_the_sandbox() {
    let s = Server::start(&[]);
    let ws = tmpdir("caps-kinds");
    let [_, pty, sandboxed] = kinds(&ws);
    for (n, (tty, sandbox)) in [pty, sandboxed].into_iter().enumerate() {
        let what = format!("tty {tty}, sandbox {}", sandbox.is_some());
        let (got, _) = run(
            &s,
            &["sh", "-c", "echo start; exec sleep 1000"],
            json!({"idleTimeoutMs": 300}),
            tty,
            sandbox.clone(),
        )
        .await;
        assert_eq!(got.limit.as_deref(), Some("idleTimeout"), "{what}");
        let (got, _) = run(
            &s,
            &["yes"],
            json!({"maxOutputBytes": 65536}),
            tty,
            sandbox.clone(),
        )
        .await;
        assert_eq!(got.limit.as_deref(), Some("outputLimit"), "{what}");
        assert_eq!(got.bytes.len(), 65536, "{what}");
        let marker = format!("4321.{n}7");
        let script = format!(
            "trap '' TERM; (setsid sh -c 'exec sleep {marker}' </dev/null >/dev/null 2>&1 &); sleep 1000"
        );
        let (got, took) = run(
            &s,
            &["sh", "-c", &script],
            json!({"timeoutMs": 500}),
            tty,
            sandbox,
        )
        .await;
        assert_eq!(got.limit.as_deref(), Some("wallTimeout"), "{what}");
        assert!(took < 6.0, "{what}: took {took:.1} s");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pids_matching(&format!("sleep {marker}")).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{what}: the daemon outlived the deadline"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = std::fs::remove_dir_all(&ws);
}

/// A script that starts a daemon (`setsid`, detached from every output)
/// running `sleep 1000`, writes its pid to `pidfile` and exits 0 once the
/// pid is written.
fn detached_daemon(pidfile: &std::path::Path) -> String {
    let f = pidfile.display();
    format!(
        "setsid sh -c 'echo $$ > {f}.tmp && mv {f}.tmp {f} && exec sleep 1000' \
         </dev/null >/dev/null 2>&1 & \
         i=0; while [ ! -s {f} ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; exit 0"
    )
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn pid_in(pidfile: &std::path::Path) -> i32 {
    std::fs::read_to_string(pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Waits (at most 5 s) until `pid` is gone; panics naming `what` otherwise.
async fn gone_within_5s(pid: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "{what}: daemon {pid} still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A daemon that detached from the command's output (so the command closes
/// at once) still dies at the command's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_outlives_the_command_for_the_daemon_it_left() {
    let s = Server::start(&[]);
    let d = tmpdir("caps-deadline-daemon");
    let pidfile = d.join("daemon.pid");
    let script = detached_daemon(&pidfile);
    let (got, took) = run(
        &s,
        &["sh", "-c", &script],
        json!({"timeoutMs": 2000}),
        false,
        None,
    )
    .await;
    assert_eq!(
        (got.exit, got.limit),
        (Some(0), None),
        "the command itself exits 0"
    );
    assert!(took < 2.0, "it closed before its deadline: {took:.2} s");
    let pid = pid_in(&pidfile);
    assert!(alive(pid), "the daemon runs past the command's end");
    gone_within_5s(pid, "the deadline").await;
    let _ = std::fs::remove_dir_all(&d);
}

/// Caps the kernel cannot take are refused (-32602), not failed at spawn.
#[tokio::test]
async fn caps_past_what_the_kernel_takes_are_refused() {
    let s = Server::start(&[]);
    let d = tmpdir("caps-max");
    let mut c = Conn::open(&s.url, None).await;
    for (limits, want) in [
        (
            json!({"maxTasks": 4_194_305u64}),
            "limits.maxTasks must be at most 4194304",
        ),
        (
            json!({"memoryBytes": u64::MAX}),
            "limits.memoryBytes must be at most",
        ),
    ] {
        let mut params = start_params("x", &["true"], &d, false, false);
        params["limits"] = limits;
        let r = c.call("process/start", params).await;
        assert_eq!(r["error"]["code"], json!(-32602), "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.starts_with(want), "{msg}");
    }
    c.close().await;
    let bad = crate::common::server_command(BIN)
        .args([
            "--listen",
            "ws://127.0.0.1:0",
            "--max-limits",
            "max-tasks=9223372036854775807",
        ])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// This test process's cgroup directories, where servers it starts make
/// theirs: in the cgroup2 mount and in each v1 hierarchy of a cap.
fn cgroup_parents() -> Vec<std::path::PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut out = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (_, names, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let mount = match names {
            "" => "/sys/fs/cgroup/unified",
            "memory" | "pids" | "cpu" => &format!("/sys/fs/cgroup/{names}"),
            _ => continue,
        };
        out.push(std::path::Path::new(mount).join(path.trim_start_matches('/')));
    }
    out
}

/// Directories named for server `pid` below the cgroup parents.
fn server_dirs(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("exec-server-{pid}-");
    cgroup_parents()
        .iter()
        .flat_map(|p| std::fs::read_dir(p).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// `run` on the embedded server leaves no cgroup directory behind, and a
/// server killed with SIGKILL has its leftovers ended by the next server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_leaves_cgroups_or_daemons_behind() {
    let child = crate::common::server_command(BIN)
        .args(["run", "--memory", "64M", "--max-tasks", "16", "--", "true"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        server_dirs(pid),
        Vec::<std::path::PathBuf>::new(),
        "embedded run {pid}"
    );

    let mut killed = Server::start(&[]);
    let d = tmpdir("caps-sweep");
    let pidfile = d.join("daemon.pid");
    let mut c = Conn::open(&killed.url, None).await;
    let script = detached_daemon(&pidfile);
    c.ok(
        "process/start",
        start_params("daemon", &["sh", "-c", &script], &d, false, false),
    )
    .await;
    c.collect("daemon", Duration::from_secs(10)).await;
    let daemon = pid_in(&pidfile);
    let dead = killed.pid();
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    assert!(alive(daemon), "orphaned by SIGKILL");
    let _next = Server::start(&[]);
    gone_within_5s(daemon, "the next server's sweep").await;
    assert_eq!(server_dirs(dead), Vec::<std::path::PathBuf>::new(), "swept");
    let _ = std::fs::remove_dir_all(&d);
}
