//! Chaos and soak tests, bounded in count and time, loopback only.

use crate::common;
use common::*;
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use serde_json::json;
use std::time::{Duration, Instant};

fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| stat[i + 1..].to_string()) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// 1000 connection drops and resumes during running streams: zero bytes lost or
/// duplicated, every exit code right.
#[tokio::test]
async fn thousand_drops_lose_nothing() {
    let s = Server::start(&[]);
    let c = ExecServerClient::new(ClientOptions::new(Source::from_url(&s.url, None).unwrap()));
    let started = Instant::now();
    let mut drops = 0;
    let mut compared = 0usize;
    for round in 0..20 {
        let n = 60_000 + round * 1000;
        let n_s = n.to_string();
        let expect: Vec<u8> = (1..=n)
            .flat_map(|i| format!("{i}\n").into_bytes())
            .collect();
        let mut p = c
            .start_process(exec_params(&format!("c{round}"), &["seq", "1", &n_s]))
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut exit = None;
        let mut round_drops = 0;
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(30), p.next_event())
                .await
                .expect("event within 30 s");
            match ev {
                Some(ProcessEvent::Output { data, .. }) => {
                    got.extend_from_slice(&data);
                    if round_drops < 50 {
                        c.drop_connection().await;
                        round_drops += 1;
                    }
                }
                Some(ProcessEvent::Exited { code, .. }) => exit = Some(code),
                Some(ProcessEvent::Closed { .. }) | None => break,
                Some(ProcessEvent::Failed(w)) => panic!("round {round}: {w}"),
            }
        }
        // Output may end before 50 drops; make up the rest between runs.
        while round_drops < 50 {
            c.drop_connection().await;
            c.environment_info().await.unwrap();
            round_drops += 1;
        }
        drops += round_drops;
        assert_eq!(exit, Some(0), "round {round}");
        assert!(
            got == expect,
            "round {round}: {} bytes vs {}",
            got.len(),
            expect.len()
        );
        compared += got.len();
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "chaos run too slow"
        );
    }
    assert_eq!(drops, 1000);
    eprintln!(
        "chaos: {drops} drops, {compared} bytes compared, {} resumes, {:?}",
        c.recoveries(),
        started.elapsed()
    );
}

/// 200 concurrent clients start, write to and read from processes while half of
/// them disconnect abruptly: no cross-talk, and afterwards no leaked processes
/// or file descriptors.
#[tokio::test]
async fn two_hundred_clients_no_crosstalk_no_leaks() {
    let s = Server::start(&["--detached-session-ttl", "1"]);
    let pid = s.pid();
    let fds_before = fd_count(pid);
    let d = tmpdir("crowd");
    let mut tasks = Vec::new();
    for k in 0..200 {
        let url = s.url.clone();
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(&url, None).await;
            c.ok(
                "process/start",
                start_params("cat", &["cat"], &d, false, true),
            )
            .await;
            let token = format!("client-{k}-token\n");
            c.ok(
                "process/write",
                json!({"processId": "cat", "chunk": b64(token.as_bytes()), "writeId": "1"}),
            )
            .await;
            let m = c
                .expect(|m| m["method"] == "process/output", WAIT)
                .await
                .expect("echo");
            assert_eq!(
                unb64(&m["params"]["chunk"]),
                token.as_bytes(),
                "client {k} got another client's output"
            );
            if k % 2 == 0 {
                drop(c); // abrupt: no close handshake, process left running
            } else {
                c.ok("process/closeStdin", json!({"processId": "cat"}))
                    .await;
                let n = c.collect("cat", WAIT).await;
                assert_eq!(n.exit, Some(0));
                c.close().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Sessions expire after 1 s; their processes are killed and reaped.
    assert!(
        eventually(Duration::from_secs(10), || children_of(pid).is_empty()).await,
        "leaked children: {:?}",
        children_of(pid)
    );
    assert!(
        eventually(Duration::from_secs(10), || fd_count(pid) <= fds_before + 2).await,
        "fds: {} before, {} after",
        fds_before,
        fd_count(pid)
    );
    assert_eq!(zombies_of(pid), Vec::<i32>::new());
}

/// SIGTERM with 100 running process trees: all gone afterwards, no orphan, no zombie.
#[tokio::test]
async fn sigterm_kills_a_hundred_trees() {
    let s = Server::start(&[]);
    let d = tmpdir("trees");
    let mut c = Conn::open(&s.url, None).await;
    for i in 0..100 {
        let tty = i % 4 == 0;
        let cmd = "sleep 311.5 & (sleep 311.5 &) ; sleep 311.5";
        c.ok(
            "process/start",
            start_params(&format!("t{i}"), &["sh", "-c", cmd], &d, tty, false),
        )
        .await;
    }
    assert!(
        eventually(Duration::from_secs(10), || pids_matching("sleep 311.5")
            .len()
            >= 300)
        .await
    );
    assert_eq!(s.terminate(), Some(0));
    assert!(
        eventually(Duration::from_secs(5), || pids_matching("sleep 311.5")
            .is_empty())
        .await,
        "survivors: {}",
        pids_matching("sleep 311.5").len()
    );
}
