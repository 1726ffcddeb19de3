//! Field cases (failures seen in use of the reference, numbered F1…) that
//! concern processes and sessions, each against the real binary on loopback, with
//! its expected value as the assertion: output, exit and close, resume, signals,
//! bytes. The rest (stdin, jobs, exit codes, cleanup) are in `field_cases_exit.rs`.

use crate::common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// F1: exit ≠ close. Output of a grandchild holding the pipe arrives; exited < closed.
#[tokio::test]
async fn f1_output_after_exit_is_not_lost() {
    let s = Server::start(&[]);
    let d = tmpdir("f1");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params(
            "p1",
            &["sh", "-c", "(sleep 0.3; echo late) & echo early"],
            &d,
            false,
            false,
        ),
    )
    .await;
    let mut cursor = 0;
    let mut bytes = Vec::new();
    let mut closed = false;
    for _ in 0..10 {
        let r = read(&mut c, "p1", cursor, 1000).await;
        for ch in r["chunks"].as_array().unwrap() {
            bytes.extend(unb64(&ch["chunk"]));
        }
        if r["closed"] == json!(true) {
            assert!(
                String::from_utf8_lossy(&bytes).contains("late"),
                "closed before late output"
            );
            closed = true;
            break;
        }
        cursor = r["nextSeq"].as_u64().unwrap() - 1;
    }
    assert!(closed);
    assert_eq!(String::from_utf8_lossy(&bytes), "early\nlate\n");
    let n = c.collect("p1", WAIT).await;
    assert!(
        n.exit_seq < n.closed_seq,
        "exited seq {} must be below closed seq {}",
        n.exit_seq,
        n.closed_seq
    );
}

/// F2: after `exited` was seen, a long-poll waits for the close instead of spinning.
#[tokio::test]
async fn f2_long_poll_after_exit_blocks_until_close() {
    let s = Server::start(&[]);
    let d = tmpdir("f2");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params(
            "p2",
            &["sh", "-c", "(sleep 1; echo tail) & exit 0"],
            &d,
            false,
            false,
        ),
    )
    .await;
    let exited = c
        .expect(
            |m| m["method"] == "process/exited" && m["params"]["processId"] == "p2",
            WAIT,
        )
        .await
        .unwrap();
    let exit_seq = exited["params"]["seq"].as_u64().unwrap();
    let t0 = Instant::now();
    let r = read(&mut c, "p2", exit_seq, 3000).await;
    let waited = t0.elapsed();
    let tail: Vec<u8> = r["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|ch| unb64(&ch["chunk"]))
        .collect();
    assert!(tail == b"tail\n" || r["closed"] == json!(true), "got {r}");
    assert!(
        waited >= Duration::from_millis(500),
        "returned after {waited:?}: busy loop"
    );
    // Once closed, reads return at once.
    c.collect("p2", WAIT).await;
    let t0 = Instant::now();
    let r = read(&mut c, "p2", 100, 3000).await;
    assert_eq!(r["closed"], json!(true));
    assert!(t0.elapsed() < Duration::from_millis(500));
}

/// F3: a dropped connection does not make the process unusable; a third resume
/// while attached fails with -32010 and does not kill the process.
#[tokio::test]
async fn f3_resume_after_drop() {
    let s = Server::start(&[]);
    let d = tmpdir("f3");
    let mut c1 = Conn::open(&s.url, None).await;
    c1.ok(
        "process/start",
        start_params("p4", &["cat"], &d, false, true),
    )
    .await;
    let w = c1
        .ok(
            "process/write",
            json!({"processId": "p4", "chunk": b64(b"a\n"), "writeId": "w1"}),
        )
        .await;
    assert_eq!(w["status"], "accepted");
    let session = c1.session.clone();
    c1.close().await;
    let mut c2 = Conn::open_retry(&s.url, &session).await;
    let w = c2
        .ok(
            "process/write",
            json!({"processId": "p4", "chunk": b64(b"b\n"), "writeId": "w2"}),
        )
        .await;
    assert_eq!(w["status"], "accepted");
    let mut got = Vec::new();
    let mut after = 0;
    for _ in 0..20 {
        let r = read(&mut c2, "p4", after, 500).await;
        for ch in r["chunks"].as_array().unwrap() {
            got.extend(unb64(&ch["chunk"]));
            after = ch["seq"].as_u64().unwrap();
        }
        if got == b"a\nb\n" {
            break;
        }
    }
    assert_eq!(got, b"a\nb\n");
    let mut c3 = Conn::connect(&s.url).await;
    let r = c3
        .call(
            "initialize",
            json!({"clientName": "t", "resumeSessionId": session}),
        )
        .await;
    assert_eq!(r["error"]["code"], json!(-32010));
    let r = read(&mut c2, "p4", after, 0).await;
    assert_eq!(
        r["exited"],
        json!(false),
        "the failed resume must not kill p4"
    );
    c2.ok("process/terminate", json!({"processId": "p4"})).await;
}

/// F4: terminate kills background jobs (pipes and PTY); so does SIGTERM to the server.
#[tokio::test]
async fn f4_terminate_kills_the_group() {
    let s = Server::start(&[]);
    let d = tmpdir("f4");
    let mut c = Conn::open(&s.url, None).await;
    for (id, tty, secs) in [("a", false, "302.1"), ("b", true, "302.2")] {
        let cmd = format!("sleep {secs} & sleep {secs} & wait");
        c.ok(
            "process/start",
            start_params(id, &["sh", "-c", &cmd], &d, tty, false),
        )
        .await;
        assert!(
            eventually(Duration::from_secs(3), || pids_matching(&format!(
                "sleep {secs}"
            ))
            .len()
                >= 2)
            .await
        );
        let r = c.ok("process/terminate", json!({"processId": id})).await;
        assert_eq!(r["running"], json!(true));
        c.collect(id, WAIT).await;
        let r = c.ok("process/terminate", json!({"processId": id})).await;
        assert_eq!(r["running"], json!(false));
        assert_gone(&format!("sleep {secs}")).await;
    }
    c.ok(
        "process/start",
        start_params(
            "c",
            &["sh", "-c", "sleep 302.3 & sleep 302.3 & wait"],
            &d,
            false,
            false,
        ),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || pids_matching("sleep 302.3")
            .len()
            >= 2)
        .await
    );
    assert_eq!(s.terminate(), Some(0));
    assert_gone("sleep 302.3").await;
}

/// F5: interrupt ends the process in both modes with 130.
#[tokio::test]
async fn f5_interrupt_exit_code_is_130_in_both_modes() {
    let s = Server::start(&[]);
    let d = tmpdir("f5");
    let mut c = Conn::open(&s.url, None).await;
    for (id, tty) in [("p7", false), ("p7t", true)] {
        // The child's first output proves it runs in its own group (and, on a
        // PTY, as the terminal's foreground job), so the signal cannot come early.
        c.ok(
            "process/start",
            start_params(
                id,
                &["sh", "-c", "echo ready; exec sleep 30"],
                &d,
                tty,
                false,
            ),
        )
        .await;
        c.expect(
            |m| m["method"] == "process/output" && m["params"]["processId"] == id,
            WAIT,
        )
        .await
        .expect("the child's first output");
        let t0 = Instant::now();
        c.ok(
            "process/signal",
            json!({"processId": id, "signal": "interrupt"}),
        )
        .await;
        let n = c.collect(id, Duration::from_secs(5)).await;
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(n.exit, Some(130), "tty={tty}");
    }
}

/// F6: a UTF-8 character split across chunks arrives byte-exact.
#[tokio::test]
async fn f6_bytes_are_never_reencoded() {
    let s = Server::start(&[]);
    let d = tmpdir("f6");
    let mut c = Conn::open(&s.url, None).await;
    for (id, tty, want) in [
        ("p8", false, &b"a\xc3\xa9b\n"[..]),
        ("p8t", true, &b"a\xc3\xa9b\r\n"[..]),
    ] {
        c.ok(
            "process/start",
            start_params(
                id,
                &["sh", "-c", "printf 'a\\303'; sleep 0.2; printf '\\251b\\n'"],
                &d,
                tty,
                false,
            ),
        )
        .await;
        let n = c.collect(id, WAIT).await;
        assert_eq!(n.bytes, want);
    }
}

/// F7: after a large chunk, a drop and a resume, the small chunks all arrive once.
#[tokio::test]
async fn f7_small_chunks_after_large_one_and_resume() {
    let s = Server::start(&[]);
    let d = tmpdir("f7");
    let mut c = Conn::open(&s.url, None).await;
    let cmd = "head -c 8000 /dev/zero | tr '\\0' X; echo; for i in 1 2 3; do sleep 0.2; echo small$i; done";
    c.ok(
        "process/start",
        start_params("p10", &["sh", "-c", cmd], &d, false, false),
    )
    .await;
    let first = c
        .expect(|m| m["method"] == "process/output", WAIT)
        .await
        .unwrap();
    let mut bytes = unb64(&first["params"]["chunk"]);
    let mut after = first["params"]["seq"].as_u64().unwrap();
    let session = c.session.clone();
    c.close().await;
    let mut c = Conn::open_retry(&s.url, &session).await;
    for _ in 0..30 {
        let r = read(&mut c, "p10", after, 2000).await;
        for ch in r["chunks"].as_array().unwrap() {
            bytes.extend(unb64(&ch["chunk"]));
        }
        after = r["nextSeq"].as_u64().unwrap() - 1;
        if r["closed"] == json!(true) {
            break;
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    for w in ["small1\n", "small2\n", "small3\n"] {
        assert_eq!(text.matches(w).count(), 1, "{w} in {text:?}");
    }
    assert_eq!(bytes.len(), 8001 + 21);
}

/// F8: an idle connection neither kills nor forgets a process. The only
/// time-based forgetting is the detached-session TTL; with it at 1 s, 4 s of
/// silence on an attached connection stands for the field report's 70 s.
#[tokio::test]
async fn f8_idle_connection_keeps_process() {
    let s = Server::start(&["--detached-session-ttl", "1"]);
    let d = tmpdir("f8");
    let mut c = Conn::open(&s.url, None).await;
    c.ok(
        "process/start",
        start_params("p12", &["sleep", "90"], &d, false, false),
    )
    .await;
    // The silence is what is tested here, not a wait for an event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = read(&mut c, "p12", 0, 0).await;
    assert_eq!(r["exited"], json!(false));
    let r = c.ok("process/terminate", json!({"processId": "p12"})).await;
    assert_eq!(r["running"], json!(true));
}
