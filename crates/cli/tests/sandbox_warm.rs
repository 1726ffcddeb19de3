//! Sandboxes prepared ahead (`--warm-sandboxes`, SANDBOX.md "Sandboxes
//! prepared ahead"): the next sandboxed start is served by a bubblewrap
//! started before it was asked for, and still gets exactly the confinement
//! its request names, alone. Which sandbox served a start is read on the
//! host: the waiting bubblewrap is a child of the server whose command line
//! names the `warm:` pipe, and `process/list` gives the served start's pid.

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Children of `server` that are warm sandboxes waiting for a command.
fn warm_children(server: u32) -> Vec<u32> {
    let parent_of = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The parent pid is the second field after the command's ")".
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(1)?.parse::<u32>().ok()
    };
    pids_matching("--sandbox-inner-exec")
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains("\0warm:") && parent_of(*pid) == Some(server)
        })
        .map(|pid| pid as u32)
        .collect()
}

/// The warm sandboxes of `server` once both for one key are there
/// (bounded: 10 s).
fn wait_for_warm(server: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let warm = warm_children(server);
        if warm.len() == 2 {
            return warm;
        }
        assert!(Instant::now() < deadline, "no warm sandboxes: {warm:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sh(id: &str, cwd: &Path, script: &str, env: Value, sandbox: Value) -> Value {
    let mut p = start_params(id, &["/bin/sh", "-c", script], cwd, false, true);
    p["env"] = env;
    p["sandbox"] = sandbox;
    p
}

/// Output of `id` until it contains `needle` (bounded: 10 s).
async fn output_until(c: &mut Conn, id: &str, needle: &str) -> String {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&out).contains(needle) {
        let left = deadline
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| {
                panic!("{id}: no {needle:?} in {:?}", String::from_utf8_lossy(&out))
            });
        let m = c
            .expect(
                |m| m["method"] == json!("process/output") && m["params"]["processId"] == json!(id),
                left,
            )
            .await
            .unwrap_or_else(|| {
                panic!("{id}: no {needle:?} in {:?}", String::from_utf8_lossy(&out))
            });
        out.extend(unb64(&m["params"]["chunk"]));
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn pid_of(list: &Value, id: &str) -> u64 {
    list["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["processId"] == json!(id)))
        .and_then(|p| p["pid"].as_u64())
        .unwrap_or_else(|| panic!("{id} not in {list}"))
}

#[tokio::test]
async fn the_next_start_is_served_warm_and_confined_alone() {
    let s = Server::start(&[]);
    let f = fixture("warm1");
    let mut c = Conn::open(&s.url, None).await;
    // The first command runs cold and keeps running: what it is and what
    // it holds must stay invisible to the next one.
    let first = sh(
        "first",
        &f.ws,
        "echo one > mark-first; echo up:$MARK; exec sleep 30",
        json!({"PATH": "/usr/bin:/bin", "MARK": "first"}),
        ww(&f.ws),
    );
    c.ok("process/start", first).await;
    output_until(&mut c, "first", "up:first").await;
    let warm = wait_for_warm(s.pid());

    let script = "echo argv:$0:$1; echo env:$(env | sort | tr '\\n' ' '); \
                  echo procs:$(cat /proc/[0-9]*/comm | tr '\\n' ' '); \
                  echo two > mark-second; (echo x > ../out/escape) 2>/dev/null || echo ro-out; \
                  read line; echo got:$line; exec sleep 30";
    let mut second = start_params(
        "second",
        &["/bin/sh", "-c", script, "arg-zero", "arg-one"],
        &f.ws,
        false,
        true,
    );
    second["env"] = json!({"PATH": "/usr/bin:/bin", "ONLY": "second"});
    second["sandbox"] = ww(&f.ws);
    c.ok("process/start", second).await;
    let list = c.ok("process/list", json!({})).await;
    let served = pid_of(&list, "second") as u32;
    assert!(
        warm.contains(&served),
        "served by a warm sandbox: {served} not in {warm:?}"
    );
    c.ok(
        "process/write",
        json!({"processId": "second", "chunk": b64(b"hello\n"), "writeId": "w1"}),
    )
    .await;
    let out = output_until(&mut c, "second", "got:hello").await;
    assert!(out.contains("argv:arg-zero:arg-one\n"), "{out}");
    // Exactly its own environment (sh adds PWD, SHLVL and `_` itself).
    let env_line = out.lines().find(|l| l.starts_with("env:")).unwrap_or("");
    let names: Vec<&str> = env_line["env:".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .filter(|k| !["PWD", "SHLVL", "_", "OLDPWD"].contains(k))
        .collect();
    assert_eq!(names, ["ONLY", "PATH"], "{out}");
    // The first command's process is in another PID namespace.
    let procs = out.lines().find(|l| l.starts_with("procs:")).unwrap_or("");
    assert!(procs.contains("cat"), "{out}");
    assert!(
        !procs.contains("sleep"),
        "the first command is visible: {out}"
    );
    // Its policy holds: the workspace writable, nothing outside it.
    assert!(out.contains("ro-out"), "{out}");
    assert!(!f.out.join("escape").exists());
    assert_eq!(
        std::fs::read_to_string(f.ws.join("mark-second")).unwrap(),
        "two\n"
    );
    for id in ["first", "second"] {
        c.ok("process/terminate", json!({"processId": id})).await;
        let done = c.collect(id, Duration::from_secs(10)).await;
        assert!(done.exit.is_some(), "{id}: {done:?}");
    }
}

#[tokio::test]
async fn a_start_with_another_policy_or_cwd_never_takes_a_warm_sandbox() {
    let s = Server::start(&[]);
    let f = fixture("warm2");
    let other = f.ws.join("sub");
    std::fs::create_dir_all(&other).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = run(&mut c, "w0", &f.ws, "echo made > made", Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    let warm = wait_for_warm(s.pid());
    // Read-only: the warm workspace-write sandbox must not serve it.
    let r = run(&mut c, "w1", &f.ws, "echo no > denied", Some(ro(&f.ws))).await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert!(!f.ws.join("denied").exists());
    // Another working directory, same policy: not served either.
    let r = run(&mut c, "w2", &other, "pwd", Some(ww(&f.ws))).await;
    assert_eq!(
        (r.exit, r.out.trim()),
        (0, other.to_str().unwrap()),
        "{r:?}"
    );
    let waiting = warm_children(s.pid());
    assert!(
        warm.iter().all(|w| waiting.contains(w)),
        "the warm sandboxes of the first policy still wait: {warm:?}, {waiting:?}"
    );
    // The same policy and directory again: served, and its exit status is the command's.
    let r = run(&mut c, "w3", &f.ws, "cat made; exit 7", Some(ww(&f.ws))).await;
    assert_eq!((r.exit, r.out.as_str()), (7, "made\n"), "{r:?}");
    let waiting = warm_children(s.pid());
    let used: Vec<&u32> = warm.iter().filter(|w| !waiting.contains(w)).collect();
    assert_eq!(used.len(), 1, "one was used: {warm:?}, {waiting:?}");
}

#[tokio::test]
async fn none_are_kept_when_turned_off_and_none_outlive_the_server() {
    let off = Server::start(&["--warm-sandboxes", "0"]);
    let f = fixture("warm3");
    let mut c = Conn::open(&off.url, None).await;
    for i in 0..2 {
        let r = run(&mut c, &format!("o{i}"), &f.ws, "true", Some(ww(&f.ws))).await;
        assert_eq!(r.exit, 0, "{r:?}");
        assert!(warm_children(off.pid()).is_empty());
    }

    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let r = run(&mut c, "on", &f.ws, "true", Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    let warm = wait_for_warm(s.pid());
    // Its placeholders (absent protected names) exist while it waits…
    assert!(f.ws.join(".codex").is_dir());
    assert_eq!(s.terminate(), Some(0));
    // …and neither they nor the sandboxes outlive the server.
    for w in warm {
        assert!(!Path::new(&format!("/proc/{w}")).exists());
    }
    assert!(!f.ws.join(".codex").exists());
}

#[tokio::test]
async fn a_protected_name_replaced_on_the_host_meanwhile_stays_protected() {
    let s = Server::start(&[]);
    let f = fixture("warm4");
    std::fs::create_dir_all(f.ws.join(".git/hooks")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = run(&mut c, "w0", &f.ws, "true", Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    wait_for_warm(s.pid());
    // Replaced on the host while the sandboxes wait: removing a path
    // detaches the read-only mount over it in every namespace.
    std::fs::remove_dir_all(f.ws.join(".git")).unwrap();
    std::fs::create_dir_all(f.ws.join(".git/hooks")).unwrap();
    std::fs::remove_dir(f.ws.join(".codex")).unwrap();
    let script = "echo pwned > .git/hooks/pre-commit; mkdir -p .codex/x; echo done";
    let r = run(&mut c, "w1", &f.ws, script, Some(ww(&f.ws))).await;
    assert!(!f.ws.join(".git/hooks/pre-commit").exists(), "{r:?}");
    assert!(!f.ws.join(".codex/x").exists(), "{r:?}");
    // It ran, confined as a cold start would be: the recreated names are
    // read-only, and the removed placeholder was made again.
    assert!(r.out.contains("done"), "{r:?}");
    assert!(f.ws.join(".codex").is_dir(), "{r:?}");
}

#[tokio::test]
async fn a_working_directory_moved_on_the_host_meanwhile_is_not_followed() {
    let s = Server::start(&[]);
    let f = fixture("warm5");
    let sub = f.ws.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::create_dir_all(f.ws.join(".git")).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let r = run(&mut c, "m0", &sub, "true", Some(ww(&f.ws))).await;
    assert_eq!(r.exit, 0, "{r:?}");
    wait_for_warm(s.pid());
    // A waiting sandbox holds its working directory itself: moved into the
    // protected `.git` and replaced, it must not take the command along.
    std::fs::rename(&sub, f.ws.join(".git/sub")).unwrap();
    std::fs::create_dir(&sub).unwrap();
    let warm = warm_children(s.pid());
    let r = run(
        &mut c,
        "m1",
        &sub,
        "echo pwned > x; echo done",
        Some(ww(&f.ws)),
    )
    .await;
    assert!(!f.ws.join(".git/sub/x").exists(), "{r:?}");
    assert!(sub.join("x").is_file(), "ran where its path is now: {r:?}");
    assert!(r.out.contains("done"), "{r:?}");
    // A warm sandbox was offered the command (and found it stale).
    let waiting = warm_children(s.pid());
    assert!(
        warm.iter().any(|w| !waiting.contains(w)),
        "no warm sandbox was tried: {warm:?}, {waiting:?}"
    );
}

#[tokio::test]
async fn a_burst_in_many_directories_keeps_the_pool_within_its_bound() {
    const CAPACITY: usize = 4;
    const STARTS: usize = 16;
    let s = Server::start(&["--warm-sandboxes", &CAPACITY.to_string()]);
    let f = fixture("warm6");
    let mut c = Conn::open(&s.url, None).await;
    // Sampled on the host while the burst runs and its sandboxes are made.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, server) = (stop.clone(), s.pid());
        std::thread::spawn(move || {
            let mut most = 0;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                most = most.max(warm_children(server).len());
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    // Each in its own directory: each a key of its own.
    for i in 0..STARTS {
        let dir = f.ws.join(format!("d{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = sh(&format!("b{i}"), &dir, "echo ran", json!({}), ww(&f.ws));
        c.send("process/start", p).await;
    }
    for i in 0..STARTS {
        let done = c.collect(&format!("b{i}"), Duration::from_secs(20)).await;
        assert_eq!((done.exit, done.bytes.as_slice()), (Some(0), &b"ran\n"[..]));
    }
    // The sandboxes made after the burst settle too.
    let settled = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.join().unwrap();
    // Those waiting and being made never exceed the bound; ended ones may
    // still be seen for the moment they take to exit beside their
    // replacements (without the bound: one pair per directory, 16 or more).
    assert!(
        most <= 2 * CAPACITY,
        "{most} warm sandboxes at once, bound {CAPACITY}"
    );
    assert!(most > 0, "none were made");
}

/// Starts `p` as `id` and waits for it to close with exit 0 (bounded: 20 s).
async fn run_to_exit_0(c: &mut Conn, id: &str, p: Value) {
    c.send("process/start", p).await;
    let done = c.collect(id, Duration::from_secs(20)).await;
    assert_eq!(done.exit, Some(0), "{id}");
}

#[tokio::test]
async fn starts_back_to_back_deepen_the_pool_up_to_its_bound() {
    let s = Server::start(&[]);
    let f = fixture("warm7");
    let mut c = Conn::open(&s.url, None).await;
    // Each start right after the previous one closed: faster than two
    // sandboxes at a time can be made, so some starts find theirs still
    // setting up.
    for i in 0..20 {
        let id = format!("r{i}");
        run_to_exit_0(&mut c, &id, sh(&id, &f.ws, "true", json!({}), ww(&f.ws))).await;
    }
    // The pool for this key is now deeper than the two an agent's paced
    // starts keep, and never over its bound of four (bounded wait: 10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut most = 0;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let warm = warm_children(s.pid()).len();
        most = most.max(warm);
        seen.push(warm);
        if most > 2 && seen.len() > 50 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    seen.dedup();
    assert!(most > 2, "the pool stayed at {most}: {seen:?}");
    assert!(most <= 4, "{most} warm sandboxes for one key: {seen:?}");
}

/// A start routed through a network proxy of its own (a new proxy, route
/// and variables each time) leaves no warm sandboxes behind: none could
/// ever be taken, and they would crowd out those that can.
#[tokio::test]
async fn a_start_with_its_own_network_proxy_prepares_nothing() {
    let s = Server::start(&[]);
    let f = fixture("warm8");
    let mut c = Conn::open(&s.url, None).await;
    for i in 0..3 {
        let id = format!("np{i}");
        let mut p = sh(&id, &f.ws, "true", json!({}), ww(&f.ws));
        p["networkProxy"] = json!({"proxy": crate::managed_network::proxy(json!({}))});
        p["enforceManagedNetwork"] = json!(true);
        run_to_exit_0(&mut c, &id, p).await;
    }
    // A plain start in another directory afterwards: its two are all the
    // pool holds once they are there.
    let other = f.ws.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let plain = sh("plain", &other, "true", json!({}), ww(&f.ws));
    run_to_exit_0(&mut c, "plain", plain).await;
    // Those of the proxied starts would have been made before these two
    // (with them, the count passes two and this wait fails).
    let warm = wait_for_warm(s.pid());
    let now = warm_children(s.pid());
    assert_eq!(
        now.len(),
        2,
        "warm sandboxes besides the plain start's: {now:?} ({warm:?})"
    );
}

/// The program each warm sandbox of `server` runs as its inner stage: the
/// argument before `--sandbox-inner-exec` in its bubblewrap command line.
fn inner_programs(server: u32) -> Vec<String> {
    wait_for_warm(server)
        .into_iter()
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmd
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let at = args
                .iter()
                .position(|a| a == "--sandbox-inner-exec")
                .unwrap_or_else(|| panic!("no inner stage in {args:?}"));
            args[at - 1].clone()
        })
        .collect()
}

/// Runs `echo ran` and a write outside the workspace under workspace-write
/// on the server at `url`; returns the output.
async fn confined_run(url: &str, ws: &Path) -> String {
    let mut c = Conn::open(url, None).await;
    let script = "echo ran; (echo x > ../out/escape) 2>/dev/null || echo ro-out";
    let env = json!({"PATH": "/usr/bin:/bin"});
    c.ok("process/start", sh("a", ws, script, env, ww(ws)))
        .await;
    output_until(&mut c, "a", "ro-out").await
}

#[tokio::test]
async fn sandboxes_run_the_small_inner_program_beside_the_server_or_else_the_server() {
    // The test's server has the inner program of its build beside it, and
    // the musl build of it too when scripts/build-inner.sh made one (as
    // scripts/test.sh does): that one is preferred.
    let s = Server::start(&[]);
    let f = fixture("inner-beside");
    let out = confined_run(&s.url, &f.ws).await;
    assert!(out.contains("ran\n") && out.contains("ro-out"), "{out}");
    let musl = Path::new(BIN).with_file_name("exec-server-inner-musl");
    let beside = if musl.exists() {
        musl
    } else {
        Path::new(BIN).with_file_name("exec-server-inner")
    };
    let programs = inner_programs(s.pid());
    assert!(
        programs.iter().all(|p| Path::new(p) == beside),
        "{programs:?}, want {}",
        beside.display()
    );
    assert!(!f.out.join("escape").exists());

    // The same server alone in a directory runs itself, as confined.
    let (mut child, url, alone) = lone_server("inner-alone");
    let f = fixture("inner-alone-ws");
    let out = confined_run(&url, &f.ws).await;
    let programs = inner_programs(child.id());
    // Stopped by its pid before the assertions can fail.
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.contains("ran\n") && out.contains("ro-out"), "{out}");
    assert!(
        programs.iter().all(|p| Path::new(p) == alone),
        "{programs:?}, want {}",
        alone.display()
    );
    assert!(!f.out.join("escape").exists());
}
