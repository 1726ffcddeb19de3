//! The client's process API against this server (embedded in the test
//! process: the same handlers as the binary): waits, output, lifetimes of what
//! a process leaves behind, and errors told apart by kind.
#![cfg(feature = "embedded")]

use exec_server_client::{
    Command, Environment, ErrorKind, ExecServerClient, ProcessEvent, TerminateOutcome,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn client() -> ExecServerClient {
    Environment::local().expect("local environment").client
}

/// A fresh directory under the system temp dir, removed by the caller.
fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "esc-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to 10 s (checking every 20 ms) for `pid` to be gone.
async fn gone_within_10s(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn wait_with_output_separates_streams_and_caps_size() {
    let c = client();
    let out = Command::new("sh")
        .args(["-c", "printf out; printf err >&2; exit 7"])
        .spawn(&c)
        .await
        .unwrap()
        .wait_with_output(1024)
        .await
        .unwrap();
    assert_eq!(
        (out.code, &out.stdout[..], &out.stderr[..], out.truncated),
        (7, &b"out"[..], &b"err"[..], false)
    );
    let capped = Command::new("head")
        .args(["-c", "100000", "/dev/zero"])
        .spawn(&c)
        .await
        .unwrap()
        .wait_with_output(1000)
        .await
        .unwrap();
    assert_eq!(
        (capped.code, capped.stdout.len(), capped.truncated),
        (0, 1000, true)
    );
}

#[tokio::test]
async fn stdin_piped_and_eof() {
    let c = client();
    let mut p = Command::new("cat").stdin_piped().spawn(&c).await.unwrap();
    assert!(p.pid().is_some(), "this server reports the pid");
    p.write(b"abc".to_vec()).await.unwrap();
    p.close_stdin().await.unwrap();
    let out = p.wait_with_output(1024).await.unwrap();
    assert_eq!((out.code, &out.stdout[..]), (0, &b"abc"[..]));
}

#[tokio::test]
async fn output_stream_yields_events_in_order() {
    use futures_util::StreamExt;
    let c = client();
    let p = Command::new("sh")
        .args(["-c", "echo one; echo two"])
        .spawn(&c)
        .await
        .unwrap();
    let events: Vec<ProcessEvent> = p.output_stream().collect().await;
    let text: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Output { data, .. } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(text, b"one\ntwo\n");
    assert!(matches!(events.last(), Some(ProcessEvent::Closed { .. })));
}

/// A shell that exits while its background child keeps stdout open: `wait()`
/// returns at the exit, and the kill option leaves nothing running.
#[tokio::test]
async fn background_child_wait_returns_and_leftovers_are_killed() {
    let c = client();
    let mut p = Command::new("sh")
        .args(["-c", "sleep 600 & echo $!; exit 4"])
        .kill_leftovers_after(Duration::from_millis(300))
        .spawn(&c)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), p.next_event())
        .await
        .expect("output within 10 s");
    let Some(ProcessEvent::Output { data, .. }) = first else {
        panic!("expected the child's pid, got {first:?}");
    };
    let child: u32 = String::from_utf8_lossy(&data).trim().parse().unwrap();
    let code = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("wait() returns at exit, not at close")
        .unwrap();
    assert_eq!(code, 4);
    assert!(gone_within_10s(child).await, "leftover {child} still runs");
    let rest = tokio::time::timeout(Duration::from_secs(10), p.next_event())
        .await
        .expect("Closed follows the kill");
    assert!(
        matches!(rest, Some(ProcessEvent::Closed { .. })),
        "{rest:?}"
    );
}

/// `terminate()` says what it did: a running process, the leftovers of an
/// exited one, nothing.
#[tokio::test]
async fn terminate_reports_what_it_killed() {
    let c = client();
    let running = Command::new("sleep").arg("600").spawn(&c).await.unwrap();
    assert_eq!(
        running.terminate().await.unwrap(),
        TerminateOutcome::KilledRunning
    );

    let mut p = Command::new("sh")
        .args(["-c", "sleep 600 & exit 0"])
        .spawn(&c)
        .await
        .unwrap();
    assert_eq!(p.wait().await.unwrap(), 0);
    assert_eq!(
        p.terminate().await.unwrap(),
        TerminateOutcome::KilledLeftovers
    );
    let out = tokio::time::timeout(Duration::from_secs(10), p.wait_with_output(1024))
        .await
        .expect("closed after the leftovers died")
        .unwrap();
    assert_eq!(out.code, 0);

    let mut done = Command::new("true").spawn(&c).await.unwrap();
    let _ = done.wait_with_output(0).await.unwrap();
    assert_eq!(
        done.terminate().await.unwrap(),
        TerminateOutcome::NothingToDo
    );
}

#[tokio::test]
async fn kill_on_drop_leaves_nothing_running() {
    let c = client();
    let p = Command::new("sleep")
        .arg("600")
        .kill_on_drop(true)
        .spawn(&c)
        .await
        .unwrap();
    let pid = p.pid().unwrap();
    assert!(alive(pid));
    drop(p);
    assert!(gone_within_10s(pid).await, "{pid} survived its handle");

    // The default keeps it running.
    let kept = Command::new("sleep").arg("600").spawn(&c).await.unwrap();
    let (pid, id) = (kept.pid().unwrap(), kept.id.clone());
    drop(kept);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(alive(pid), "dropped without kill_on_drop: still running");
    assert_eq!(
        c.terminate(&id).await.unwrap(),
        TerminateOutcome::KilledRunning
    );
}

#[tokio::test]
async fn start_errors_are_told_apart_by_kind() {
    let c = client();
    let dir = temp_dir("kinds");
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();

    let missing = Command::new("no-such-program-here")
        .spawn(&c)
        .await
        .err()
        .unwrap();
    assert_eq!(missing.kind(), ErrorKind::ProgramNotFound, "{missing}");
    assert_eq!(missing.os_error(), Some(2));
    assert_eq!(missing.code(), Some(-32603), "the reference's code");
    assert_eq!(
        missing.server_error().map(|e| e.message.as_str()),
        Some("No such file or directory (os error 2)"),
        "the reference's text"
    );

    let no_cwd = Command::new("true")
        .cwd(dir.join("gone"))
        .spawn(&c)
        .await
        .err()
        .unwrap();
    assert_eq!(no_cwd.kind(), ErrorKind::CwdNotFound, "{no_cwd}");
    assert_eq!(no_cwd.path(), dir.join("gone").to_str());

    let not_exec = Command::new(plain.to_str().unwrap())
        .spawn(&c)
        .await
        .err()
        .unwrap();
    assert_eq!(not_exec.kind(), ErrorKind::NotExecutable, "{not_exec}");
    assert_eq!(not_exec.os_error(), Some(13));

    let not_found = c
        .read_file(&exec_server_client::PathUri::from_path(&dir.join("nothing")).unwrap())
        .await
        .err()
        .unwrap();
    assert_eq!(not_found.kind(), ErrorKind::NotFound);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 32: an embedded server waits for the children it started, nothing
/// else. The host program's own children, spawned and waited for with std and
/// tokio while embedded commands run, all keep their exit statuses (a server
/// that reaped with `waitpid(-1)` took them: ECHILD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_programs_own_children_keep_their_statuses() {
    let c = client();
    let embedded = tokio::spawn(async move {
        let mut codes = Vec::new();
        for i in 0..20 {
            let out = Command::new("sh")
                .args(["-c", &format!("exit {}", i % 7)])
                .spawn(&c)
                .await
                .unwrap()
                .wait_with_output(16)
                .await
                .unwrap();
            codes.push(out.code);
        }
        codes
    });
    let std_children = std::thread::spawn(|| {
        (0..20)
            .map(|i| {
                std::process::Command::new("sh")
                    .args(["-c", &format!("sleep 0.0{}; exit {}", i % 5, i % 11)])
                    .status()
                    .map(|s| s.code())
                    .map_err(|e| e.to_string())
            })
            .collect::<Vec<_>>()
    });
    let mut tokio_codes = Vec::new();
    for i in 0..20 {
        let status = tokio::process::Command::new("sh")
            .args(["-c", &format!("sleep 0.0{}; exit {}", i % 3, i % 13)])
            .status()
            .await
            .map(|s| s.code())
            .map_err(|e| e.to_string());
        tokio_codes.push(status);
    }
    let want = |m: i32| (0..20).map(|i| Ok(Some(i % m))).collect::<Vec<_>>();
    assert_eq!(tokio_codes, want(13), "tokio waits");
    assert_eq!(std_children.join().unwrap(), want(11), "std waits");
    let embedded = embedded.await.unwrap();
    assert_eq!(embedded, (0..20).map(|i| i % 7).collect::<Vec<_>>());
}
