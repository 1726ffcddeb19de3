//! Nothing lost, nothing leaked, nothing stuck (issue 12): streams through
//! connections aborted at random byte offsets, descriptors and threads after
//! session expiry, thousands of short processes on one session, a slow
//! consumer, and a client that never acknowledges paging through the spool.
//! Loopback only; every loop bounded in count and time.

use crate::common;
use common::cut_proxy::CutProxy;
use common::*;
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use serde_json::json;
use std::time::Duration;

const LINES: usize = 2_000_000;

fn seq_output(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 8);
    for i in 1..=n {
        out.extend_from_slice(i.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Runs the binary with `args` (stdin empty), at most 120 s.
async fn run_bin(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let what = args.join(" ");
    let out = tokio::task::spawn_blocking(move || {
        crate::common::server_command(BIN)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("start exec-server")
    });
    tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .unwrap_or_else(|_| panic!("`exec-server {what}` finished within 120 s"))
        .unwrap()
}

/// `exec-server run` through 1 to 10 aborted connections: byte-identical
/// output and exit code 0, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_random_cuts_is_exact() {
    let s = Server::start(&[]);
    let want = seq_output(LINES);
    for (cuts, seed) in [(1, 11), (3, 23), (5, 37), (10, 41)] {
        // At most 1 MiB each, so all cuts happen within the 14.9 MB stream.
        let proxy = CutProxy::start(&s.url, cuts, 200_000, 1_000_000, seed).await;
        let lines = LINES.to_string();
        let url = proxy.url.as_str();
        let out = run_bin(&["run", "--connect", url, "--", "seq", "1", &lines]).await;
        assert_eq!(out.status.code(), Some(0), "{cuts} cuts: exit status");
        assert_eq!(
            first_difference(&out.stdout, &want),
            None,
            "{cuts} cuts: {} bytes of {}",
            out.stdout.len(),
            want.len()
        );
        // The last planned cuts may not happen: once the output is complete
        // the connection carries too few bytes to reach a budget (a faster
        // server finishes sooner). Output was exact through those that did.
        let happened = proxy.cuts();
        assert!((1..=cuts).contains(&happened), "{happened} of {cuts} cuts");
    }
}

/// The library's process stream through 1 to 10 aborted connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_stream_through_random_cuts_is_exact() {
    let s = Server::start(&[]);
    let want = seq_output(LINES);
    for (cuts, seed) in [(2, 5), (4, 9), (10, 13)] {
        let proxy = CutProxy::start(&s.url, cuts, 200_000, 1_000_000, seed).await;
        let c = ExecServerClient::new(ClientOptions::new(
            Source::from_url(&proxy.url, None).unwrap(),
        ));
        let mut p = c
            .start_process(exec_params(
                &format!("cuts{cuts}"),
                &["seq", "1", &LINES.to_string()],
            ))
            .await
            .unwrap();
        let events = record_connection_events(&c);
        let mut got = Vec::with_capacity(want.len());
        let mut exit = None;
        loop {
            let Ok(ev) = tokio::time::timeout(Duration::from_secs(60), p.next_event()).await else {
                // What each side holds, so that a stall says where it is.
                let server = tokio::time::timeout(
                    Duration::from_secs(5),
                    c.call::<_, serde_json::Value>(
                        "process/read",
                        &json!({"processId": format!("cuts{cuts}"), "afterSeq": 0, "maxBytes": 1, "waitMs": 0}),
                        false,
                    ),
                )
                .await;
                panic!(
                    "{cuts} cuts: stalled at {} of {} bytes; {} cuts made, {} recoveries, \
                     {} bytes queued; connection events {:?}; the server's process/read: {:?}",
                    got.len(),
                    want.len(),
                    proxy.cuts(),
                    c.recoveries(),
                    p.queued_output_bytes(),
                    events.lock().unwrap(),
                    server.map(|r| r.map(|mut v| {
                        v["chunks"] = json!("…");
                        v
                    })),
                )
            };
            match ev {
                Some(ProcessEvent::Output { data, .. }) => got.extend_from_slice(&data),
                Some(ProcessEvent::Exited { code, .. }) => exit = Some(code),
                Some(ProcessEvent::Closed { .. }) | None => break,
                Some(ProcessEvent::Failed(w)) => panic!("{cuts} cuts: {w}"),
            }
        }
        assert_eq!(exit, Some(0));
        assert_eq!(first_difference(&got, &want), None, "{cuts} cuts");
        // As above, the last planned cuts may not happen; every one that did
        // was recovered from (a cut after the last event may still be
        // recovering now, hence one less at most).
        let happened = proxy.cuts();
        assert!((1..=cuts).contains(&happened), "{happened} of {cuts} cuts");
        let recovered = c.recoveries() as usize;
        assert!(
            recovered == happened || recovered + 1 == happened,
            "{recovered} recoveries for {happened} cuts"
        );
        c.close().await;
    }
}

/// Every connection event of `c` from now on, as text, in order.
fn record_connection_events(c: &ExecServerClient) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rx = c.connection_events();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok(ev) = rx.recv().await {
            log.lock().unwrap().push(format!("{ev:?}"));
        }
    });
    seen
}

/// `exec-server fs put` of a file through aborted connections: the upload
/// starts over on the resumed session (its file handle ended with the
/// connection) and the file on the server is byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_put_through_random_cuts_is_exact() {
    let s = Server::start(&[]);
    let d = tmpdir("put-cuts");
    let src = d.join("src");
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    for (cuts, seed) in [(1, 7), (2, 19)] {
        // The handshake and `initialize` take about 1.3 KB from the server
        // and each `fs/writeBlock` answer about 60 bytes: each cut falls
        // while blocks are in flight.
        let proxy = CutProxy::start(&s.url, cuts, 1_500, 2_000, seed).await;
        let dst = d.join(format!("dst-{cuts}"));
        let (from, to) = (src.display().to_string(), dst.display().to_string());
        let out = run_bin(&["fs", "--connect", &proxy.url, "put", &from, &to]).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{cuts} cuts: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = std::fs::read(&dst).unwrap();
        assert_eq!(first_difference(&got, &data), None, "{cuts} cuts");
        // As in the test above, a planned cut may come after the last byte
        // under load (the upload was quicker than the cut's byte count).
        let happened = proxy.cuts();
        assert!((1..=cuts).contains(&happened), "{happened} of {cuts} cuts");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn expired_sessions_return_fds_and_threads_to_baseline() {
    let s = Server::start(&["--detached-session-ttl", "1"]);
    let pid = s.pid();
    // Warm up: one session through its whole life, so lazily created
    // resources (the reaper, the runtime's pools) exist before the baseline.
    {
        let mut c = Conn::open(&s.url, None).await;
        c.ok(
            "process/start",
            start_params("w", &["true"], std::path::Path::new("/"), true, false),
        )
        .await;
        c.collect("w", WAIT).await;
        c.close().await;
    }
    let base_fds = fd_count(pid);
    let base_threads = thread_count(pid);
    // Each session expires a second after its close, maybe before the
    // last one is started (a loaded machine): its processes are counted by
    // the pids their starts returned.
    let mut started = Vec::new();
    for i in 0..10 {
        let mut c = Conn::open(&s.url, None).await;
        for (id, tty) in [(format!("t{i}"), true), (format!("p{i}"), false)] {
            let r = c
                .ok(
                    "process/start",
                    start_params(
                        &id,
                        &["sleep", "317"],
                        std::path::Path::new("/"),
                        tty,
                        false,
                    ),
                )
                .await;
            started.push(r["pid"].as_u64().expect("pid") as u32);
        }
        c.close().await;
    }
    assert_eq!(started.len(), 20);
    assert!(
        eventually(Duration::from_secs(20), || started
            .iter()
            .all(|p| !alive(*p)))
        .await,
        "the processes of expired sessions are killed: {:?} alive",
        started.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    assert!(
        eventually(Duration::from_secs(20), || fd_count(pid) <= base_fds).await,
        "fds: {} now, {base_fds} before",
        fd_count(pid)
    );
    // One more than the baseline is tolerated: a runtime pool thread the
    // warm-up did not need may start lazily; a leak per session would be ten
    // or more.
    assert!(
        eventually(Duration::from_secs(30), || thread_count(pid)
            <= base_threads + 1)
        .await,
        "threads: {} now, {base_threads} before",
        thread_count(pid)
    );
}

/// 5000 short processes on one session, at most 64 at a time: every start
/// succeeds (exited records never count against the process limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_short_processes_on_one_session_all_start() {
    let s = Server::start(&["--process-cgroups", "off"]);
    let c = ExecServerClient::new(ClientOptions::new(Source::from_url(&s.url, None).unwrap()));
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..5000 {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let c = c.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let mut p = c
                .start_process(exec_params(&format!("short{i}"), &["true"]))
                .await
                .map_err(|e| format!("start {i}: {e}"))?;
            let mut exit = None;
            while let Some(ev) = tokio::time::timeout(Duration::from_secs(30), p.next_event())
                .await
                .map_err(|_| format!("process {i} stalled"))?
            {
                match ev {
                    ProcessEvent::Exited { code, .. } => exit = Some(code),
                    ProcessEvent::Failed(w) => return Err(format!("{i}: {w}")),
                    _ => {}
                }
            }
            if exit != Some(0) {
                return Err(format!("{i}: exit {exit:?}"));
            }
            Ok::<_, String>(())
        });
        while let Some(r) = tasks.try_join_next() {
            r.unwrap().unwrap();
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
}

/// A consumer that does not read: the client queues a bounded amount and the
/// server stops reading the child; then every byte still arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_keeps_client_memory_bounded() {
    let s = Server::start(&[]);
    let c = ExecServerClient::new(ClientOptions::new(Source::from_url(&s.url, None).unwrap()));
    let total: usize = 256 * 1024 * 1024;
    let mut p = c
        .start_process(exec_params(
            "slow",
            &["head", "-c", &total.to_string(), "/dev/zero"],
        ))
        .await
        .unwrap();
    let cap = exec_server_client::MAX_QUEUED_OUTPUT_BYTES;
    assert!(
        eventually(Duration::from_secs(10), || p.queued_output_bytes() > 0).await,
        "output arrives"
    );
    // Whatever the timing, the queue never passes its cap while nobody reads.
    let mut peak = 0;
    for _ in 0..40 {
        peak = peak.max(p.queued_output_bytes());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(peak <= cap, "queued {peak} > {cap}");
    assert!(
        proc_status_kib(std::process::id(), "VmRSS") < 192 * 1024,
        "the test process holds {} KiB",
        proc_status_kib(std::process::id(), "VmRSS")
    );
    let mut got = 0usize;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(60), p.next_event())
            .await
            .expect("events keep coming");
        match ev {
            Some(ProcessEvent::Output { data, .. }) => {
                assert!(data.iter().all(|b| *b == 0));
                got += data.len();
                peak = peak.max(p.queued_output_bytes());
            }
            Some(ProcessEvent::Exited { code, .. }) => assert_eq!(code, 0),
            Some(ProcessEvent::Closed { .. }) | None => break,
            Some(ProcessEvent::Failed(w)) => panic!("{w}"),
        }
    }
    assert_eq!(got, total);
    assert!(peak <= cap, "queued {peak} > {cap}");
}

/// A client that never acknowledges and pages 256 MiB with `process/read`
/// while the same output is pushed to it: with a spool large enough (the
/// default is 64 MiB), every byte arrives, from the spool, and the server's
/// memory stays under 64 MiB.
#[tokio::test]
async fn a_non_acknowledging_pager_gets_every_byte_from_the_spool() {
    let spool = tmpdir("spool-pager");
    let spool_dir = spool.join("s");
    let total: u64 = 256 * 1024 * 1024;
    let s = Server::start(&[
        "--output-spool-dir",
        spool_dir.to_str().unwrap(),
        "--output-spool-bytes",
        // Room for the records' headers too.
        &(2 * total).to_string(),
    ]);
    let mut c = Conn::open(&s.url, None).await;
    c.ok_dropping_notifications(
        "process/start",
        start_params(
            "big",
            &[
                "sh",
                "-c",
                &format!("yes 0123456789abcde | head -c {total}"),
            ],
            std::path::Path::new("/"),
            false,
            false,
        ),
    )
    .await;
    let mut after = 0u64;
    let mut got = 0u64;
    let mut peak_kib = 0;
    // `yes` repeats a 16-byte record: a lost, repeated or reordered chunk
    // breaks the pattern or the seq.
    let record = b"0123456789abcde\n";
    let mut offset = 0usize;
    for _ in 0..100_000 {
        let r = c
            .ok_dropping_notifications(
                "process/read",
                json!({"processId": "big", "afterSeq": after, "waitMs": 2000}),
            )
            .await;
        for chunk in r["chunks"].as_array().unwrap() {
            let seq = chunk["seq"].as_u64().unwrap();
            assert_eq!(seq, after + 1, "no seq jump");
            after = seq;
            let data = unb64(&chunk["chunk"]);
            for b in &data {
                assert_eq!(*b, record[offset % 16], "byte {got}");
                offset += 1;
            }
            got += data.len() as u64;
        }
        peak_kib = peak_kib.max(proc_status_kib(s.pid(), "VmRSS"));
        if r["closed"] == json!(true) {
            break;
        }
    }
    assert_eq!(got, total, "every byte arrived");
    assert!(peak_kib < 64 * 1024, "server RSS peaked at {peak_kib} KiB");
    // The spool keeps no named files, ever.
    assert_eq!(std::fs::read_dir(&spool_dir).unwrap().count(), 0);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&spool_dir).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o700);
    let _ = std::fs::remove_dir_all(&spool);
}

/// `outputWindowBytes` (ours): refused without `ackOutput` or at 0; with
/// it, a window above the default 8 MiB holds that much unacknowledged
/// output before the child blocks, and an acknowledgement lets the rest
/// through, nothing lost.
#[tokio::test]
async fn an_acknowledging_client_chooses_its_output_window() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let dir = tmpdir("output-window");
    for (extra, why) in [
        (json!({"outputWindowBytes": 1 << 20}), "without ackOutput"),
        (json!({"ackOutput": true, "outputWindowBytes": 0}), "zero"),
    ] {
        let mut p = start_params("w", &["true"], &dir, false, false);
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        let r = c.call("process/start", p).await;
        assert_eq!(r["error"]["code"], -32602, "{why}: {r}");
    }
    const WINDOW: usize = 12 << 20;
    const TOTAL: usize = 20 << 20;
    let mut p = start_params(
        "w",
        &["head", "-c", &TOTAL.to_string(), "/dev/zero"],
        &dir,
        false,
        false,
    );
    p["ackOutput"] = json!(true);
    p["outputWindowBytes"] = json!(WINDOW);
    c.ok("process/start", p).await;
    // No acknowledgement yet: the server pushes until the window is full,
    // then stops reading (the child blocks in write(2)).
    let (mut got, mut last_seq) = (0, 0);
    while let Some(m) = c
        .expect(|m| m["method"] == "process/output", Duration::from_secs(2))
        .await
    {
        got += unb64(&m["params"]["chunk"]).len();
        last_seq = m["params"]["seq"].as_u64().unwrap();
        assert!(got < TOTAL, "the window never paused the child");
    }
    assert!(
        (WINDOW..WINDOW + (2 << 20)).contains(&got),
        "paused after {got} bytes, not at the 12 MiB window"
    );
    c.ok("process/ack", json!({"processId": "w", "seq": last_seq}))
        .await;
    let rest = c.collect("w", WAIT).await;
    assert_eq!(rest.exit, Some(0));
    assert_eq!(got + rest.bytes.len(), TOTAL, "every byte, once");
    let _ = std::fs::remove_dir_all(&dir);
}
