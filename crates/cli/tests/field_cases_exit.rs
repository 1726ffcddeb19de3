//! Field cases (continued from `field_cases.rs`): stdin end of file, heredocs,
//! jobs on a PTY, big output, exit codes, short-lived processes, zombies and the
//! session TTL, signals, PTY output.

use crate::common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// F9 and F13: stdin EOF — none means EOF at once; closeStdin ends `wc` and `sort`;
/// a drop is not EOF.
#[tokio::test]
async fn f9_f13_stdin_end_of_file() {
    let s = Server::start(&[]);
    let d = tmpdir("f9");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p13a", &["cat"], &d, false, false),
    )
    .await;
    let t0 = Instant::now();
    let n = c.collect("p13a", Duration::from_secs(2)).await;
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!((n.exit, n.bytes.len()), (Some(0), 0));

    c.ok(
        "process/start",
        start_params("p13b", &["wc", "-c"], &d, false, true),
    )
    .await;
    c.ok(
        "process/write",
        json!({"processId": "p13b", "chunk": b64(b"abc"), "writeId": "w1"}),
    )
    .await;
    let r = c
        .ok(
            "process/write",
            json!({"processId": "p13b", "chunk": "", "writeId": "w2"}),
        )
        .await;
    assert_eq!(
        r["status"], "accepted",
        "an empty write is accepted and is not EOF"
    );
    let r = c
        .ok("process/closeStdin", json!({"processId": "p13b"}))
        .await;
    assert_eq!(r["status"], "accepted");
    let n = c.collect("p13b", WAIT).await;
    assert_eq!(String::from_utf8_lossy(&n.bytes).trim(), "3");
    assert_eq!(n.exit, Some(0));

    c.ok(
        "process/start",
        start_params("p20", &["sort"], &d, false, true),
    )
    .await;
    c.ok(
        "process/write",
        json!({"processId": "p20", "chunk": b64(b"b\na\n"), "writeId": "w1"}),
    )
    .await;
    let session = c.session.clone();
    c.close().await;
    let mut c = Conn::open_retry(&s.url, &session).await;
    let r = read(&mut c, "p20", 0, 300).await;
    assert_eq!(
        r["exited"],
        json!(false),
        "a dropped connection is not EOF: sort still waits"
    );
    c.ok("process/closeStdin", json!({"processId": "p20"}))
        .await;
    let mut out = Vec::new();
    let mut after = 0;
    for _ in 0..20 {
        let r = read(&mut c, "p20", after, 2000).await;
        for ch in r["chunks"].as_array().unwrap() {
            out.extend(unb64(&ch["chunk"]));
        }
        after = r["nextSeq"].as_u64().unwrap() - 1;
        if r["closed"] == json!(true) {
            assert_eq!(r["exitCode"], json!(0));
            break;
        }
    }
    assert_eq!(out, b"a\nb\n");
}

/// F10: a heredoc runs in both modes.
#[tokio::test]
async fn f10_heredoc() {
    let s = Server::start(&[]);
    let d = tmpdir("f10");
    let mut c = Conn::open(&s.url, None).await;
    for (id, tty, want) in [("p15", false, "hello\n"), ("p15t", true, "hello\r\n")] {
        let t0 = Instant::now();
        c.ok(
            "process/start",
            start_params(
                id,
                &["sh", "-c", "cat <<'EOF' > f.txt\nhello\nEOF\ncat f.txt"],
                &d,
                tty,
                false,
            ),
        )
        .await;
        let n = c.collect(id, Duration::from_secs(2)).await;
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(
            (String::from_utf8_lossy(&n.bytes).as_ref(), n.exit),
            (want, Some(0))
        );
    }
}

/// F11 and F21: terminating a PTY process kills nohup'd and piped jobs.
#[tokio::test]
async fn f11_f21_pty_terminate_kills_jobs() {
    let s = Server::start(&[]);
    let d = tmpdir("f11");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params(
            "p17",
            &[
                "bash",
                "-c",
                "nohup sleep 305 >/dev/null 2>&1 & echo started; sleep 300",
            ],
            &d,
            true,
            false,
        ),
    )
    .await;
    c.expect(
        |m| m["method"] == "process/output" && unb64(&m["params"]["chunk"]).starts_with(b"started"),
        WAIT,
    )
    .await
    .unwrap();
    c.ok("process/terminate", json!({"processId": "p17"})).await;
    assert_gone("sleep 305").await;
    c.ok(
        "process/start",
        start_params(
            "p30",
            &["bash", "-c", "sleep 307 | cat & wait"],
            &d,
            true,
            false,
        ),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || !pids_matching("sleep 307")
            .is_empty())
        .await
    );
    c.ok("process/terminate", json!({"processId": "p30"})).await;
    assert_gone("sleep 307").await;
}

/// F12: a stream above the retention cap ends with its last line and exit 0; a late
/// read shows the loss as a seq jump, never as a complete-looking stream.
#[tokio::test]
async fn f12_big_output_is_complete_or_visibly_cut() {
    let s = Server::start(&[]);
    let d = tmpdir("f12");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p19", &["seq", "1", "200000"], &d, false, false),
    )
    .await;
    let n = c.collect("p19", Duration::from_secs(20)).await;
    assert!(n.bytes.ends_with(b"200000\n"));
    assert_eq!(n.exit, Some(0));
    let r = read(&mut c, "p19", 0, 0).await;
    let chunks = r["chunks"].as_array().unwrap();
    let late: Vec<u8> = chunks.iter().flat_map(|ch| unb64(&ch["chunk"])).collect();
    let first_seq = chunks[0]["seq"].as_u64().unwrap();
    assert!(
        late == n.bytes || first_seq > 1,
        "partial stream without a visible gap"
    );
}

/// F14: exit codes: status, and 143 for SIGTERM; kept across a drop and resume.
#[tokio::test]
async fn f14_exit_codes() {
    let s = Server::start(&[]);
    let d = tmpdir("f14");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p21b", &["sh", "-c", "kill -TERM $$"], &d, false, false),
    )
    .await;
    assert_eq!(c.collect("p21b", WAIT).await.exit, Some(143));
    c.ok(
        "process/start",
        start_params("p21a", &["sh", "-c", "sleep 0.2; exit 3"], &d, false, false),
    )
    .await;
    let session = c.session.clone();
    c.close().await;
    let mut c = Conn::open_retry(&s.url, &session).await;
    let r = read(&mut c, "p21a", 0, 3000).await;
    let r = if r["exited"] == json!(true) {
        r
    } else {
        read(&mut c, "p21a", 0, 3000).await
    };
    assert_eq!(
        (r["exited"].clone(), r["exitCode"].clone()),
        (json!(true), json!(3))
    );
}

/// F15: 200 short commands each give their output exactly.
#[tokio::test]
async fn f15_short_lived_processes_lose_nothing() {
    let s = Server::start(&[]);
    let d = tmpdir("f15");
    let mut c = Conn::open(&s.url, None).await;
    let t0 = Instant::now();
    for i in 0..200 {
        let id = format!("q{i}");
        c.ok(
            "process/start",
            start_params(&id, &["echo", "running"], &d, false, false),
        )
        .await;
        let n = c.collect(&id, WAIT).await;
        assert_eq!(
            (n.bytes.as_slice(), n.exit),
            (&b"running\n"[..], Some(0)),
            "run {i}"
        );
        assert!(t0.elapsed() < Duration::from_secs(60));
    }
}

/// F16: no zombies; after the detached TTL the session's processes are gone.
#[tokio::test]
async fn f16_no_zombies_and_ttl_cleanup() {
    let s = Server::start(&["--detached-session-ttl", "2"]);
    let d = tmpdir("f16");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params(
            "p24",
            &["sh", "-c", "sleep 1.01 & sleep 306 & exit 0"],
            &d,
            false,
            false,
        ),
    )
    .await;
    // The short orphan must appear, end, and be reaped by the server.
    assert!(
        eventually(Duration::from_secs(3), || !pids_matching("sleep 1.01")
            .is_empty())
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || pids_matching("sleep 1.01")
            .is_empty()
            && zombies_of(s.pid()).is_empty())
        .await,
        "zombies left: {:?}",
        zombies_of(s.pid())
    );
    assert_eq!(pids_matching("sleep 306").len(), 1);
    c.close().await;
    assert!(
        eventually(Duration::from_secs(6), || pids_matching("sleep 306")
            .is_empty())
        .await,
        "sleep 306 survived the session TTL"
    );
    // A killed process is a zombie (with an empty command line) until the
    // reaper has waited for it: that happens, but not in the same instant.
    assert!(
        eventually(Duration::from_secs(5), || zombies_of(s.pid()).is_empty()).await,
        "zombies left: {:?}",
        zombies_of(s.pid())
    );
}

/// F17: signals work whatever the state of stdin.
#[tokio::test]
async fn f17_signal_after_stdin_eof() {
    let s = Server::start(&[]);
    let d = tmpdir("f17");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p25", &["sleep", "30"], &d, false, false),
    )
    .await;
    let t0 = Instant::now();
    c.ok(
        "process/signal",
        json!({"processId": "p25", "signal": "interrupt"}),
    )
    .await;
    let n = c.collect("p25", Duration::from_secs(2)).await;
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(n.exit, Some(130));
    let r = c.ok("process/terminate", json!({"processId": "p25"})).await;
    assert_eq!(r["running"], json!(false));
}

/// F20: PTY output is complete.
#[tokio::test]
async fn f20_pty_output_complete() {
    let s = Server::start(&[]);
    let d = tmpdir("f20");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p29", &["seq", "1", "50000"], &d, true, false),
    )
    .await;
    let n = c.collect("p29", Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&n.bytes);
    assert!(text.ends_with("50000\r\n"));
    assert_eq!(text.matches("\r\n").count(), 50000);
}
