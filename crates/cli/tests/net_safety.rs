//! Resource and error safety of HTTP, watches and transports (issue 19, items
//! 6, 7, 8, 10, 11, 12), against the real binary: the server stays up, memory,
//! fds, threads and inotify instances stay bounded, errors say what happened.
//! HTTP goes only to a loopback server this test starts.

use crate::common;
use common::loopback_http::http_server;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The error message of a call that must fail with -32603.
async fn internal_error(c: &mut Conn, method: &str, params: Value) -> String {
    let r = c.call(method, params).await;
    assert_eq!(r["error"]["code"], -32603, "{method}: {r}");
    r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn buffered_http_body_is_capped_without_growing_memory() {
    let (base, web) = http_server().await;
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    // An endless body: refused at the 64 MiB default, never held past it.
    let why = internal_error(
        &mut c,
        "http/request",
        json!({"method": "GET", "url": format!("{base}/endless"), "requestId": "big"}),
    )
    .await;
    assert!(
        why.contains("67108864") && why.contains("streamResponse"),
        "{why}"
    );
    let peak_kib = proc_status_kib(s.pid(), "VmHWM");
    eprintln!("server peak RSS after an endless buffered body: {peak_kib} KiB");
    assert!(
        peak_kib < 192 * 1024,
        "server peaked at {peak_kib} KiB for a 64 MiB cap"
    );
    // Still serving, and a body under the cap arrives whole.
    let r = c
        .ok(
            "http/request",
            json!({"method": "GET", "url": format!("{base}/length/5000"), "requestId": "ok"}),
        )
        .await;
    assert_eq!(unb64(&r["bodyBase64"]).len(), 5000);

    // The flag moves the cap; the boundary is exact, with or without a length.
    let small = Server::start(&["--max-http-body-bytes", "1000"]);
    let mut c = Conn::open(&small.url, None).await;
    for route in ["length", "chunked"] {
        let r = c
            .ok(
                "http/request",
                json!({"method": "GET", "url": format!("{base}/{route}/1000"), "requestId": "at"}),
            )
            .await;
        assert_eq!(unb64(&r["bodyBase64"]), vec![b'x'; 1000], "{route}");
        let why = internal_error(
            &mut c,
            "http/request",
            json!({"method": "GET", "url": format!("{base}/{route}/1001"), "requestId": "over"}),
        )
        .await;
        assert!(why.contains("streamResponse"), "{route}: {why}");
    }
    // Streamed bodies are not capped.
    let id = c
        .send(
            "http/request",
            json!({"method": "GET", "url": format!("{base}/chunked/5000"), "requestId": "st", "streamResponse": true}),
        )
        .await;
    assert_eq!(c.response(id).await["result"]["status"], 200);
    let mut body = Vec::new();
    for _ in 0..100 {
        let d = c
            .expect(|m| m["method"] == "http/request/bodyDelta", WAIT)
            .await
            .expect("body delta");
        body.extend(unb64(&d["params"]["deltaBase64"]));
        if d["params"]["done"] == true {
            assert!(d["params"]["error"].is_null(), "{d}");
            break;
        }
    }
    assert_eq!(body.len(), 5000);
    web.abort();
}

#[tokio::test]
async fn http_timeouts_and_refused_redirects_say_what_happened() {
    let (base, web) = http_server().await;
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    // A timeout is a timeout: before the headers, while reading the body, and 0.
    for (route, ms) in [("echo", 0), ("slow", 100), ("stall-body", 300)] {
        let why = internal_error(
            &mut c,
            "http/request",
            json!({"method": "GET", "url": format!("{base}/{route}"), "requestId": route, "timeoutMs": ms}),
        )
        .await;
        assert!(
            why.contains("timed out"),
            "{route} with timeoutMs {ms}: {why}"
        );
    }
    // While streaming, the final delta says so too.
    let id = c
        .send(
            "http/request",
            json!({"method": "GET", "url": format!("{base}/stall-body"), "requestId": "sb", "timeoutMs": 300, "streamResponse": true}),
        )
        .await;
    assert_eq!(c.response(id).await["result"]["status"], 200);
    let last = c
        .expect(
            |m| m["method"] == "http/request/bodyDelta" && m["params"]["done"] == true,
            WAIT,
        )
        .await
        .expect("final delta");
    let err = last["params"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("timed out"), "{last}");

    // A redirect out of http/https is refused under `follow` (the default), as the
    // reference does; `stop` hands the 302 back.
    for (location, scheme) in [
        ("file:///etc/passwd", "file"),
        ("ftp://127.0.0.1/x", "ftp"),
        ("data:text/plain,hi", "data"),
    ] {
        let url = format!("{base}/redirect-to/{location}");
        for extra in [
            json!({}),
            json!({"redirectPolicy": "follow"}),
            json!({"redirectPolicy": "follow", "streamResponse": true}),
        ] {
            let mut p = json!({"method": "GET", "url": url, "requestId": "r"});
            p.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let why = internal_error(&mut c, "http/request", p).await;
            assert_eq!(
                why,
                format!(
                    "http/request failed: redirect target uses unsupported URL scheme: {scheme}"
                ),
                "{location} {extra}"
            );
        }
        let r = c
            .ok(
                "http/request",
                json!({"method": "GET", "url": url, "requestId": "r", "redirectPolicy": "stop"}),
            )
            .await;
        assert_eq!(r["status"], 302);
        assert!(r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["name"] == "location" && h["value"] == location));
    }
    web.abort();
}

/// Bytes of one unterminated line a transport test offers at most: 256 MiB.
const ENDLESS_LINE_LIMIT: usize = 256 << 20;

/// Writes `x` without a newline into `sink` until it fails or
/// [`ENDLESS_LINE_LIMIT`] is written, sampling `pid`'s RSS after every MiB while
/// it runs; returns (bytes written, highest RSS seen in KiB).
fn write_endless_line(sink: &mut impl std::io::Write, pid: u32) -> (usize, u64) {
    let chunk = vec![b'x'; 1 << 20];
    let (mut written, mut peak) = (0, 0);
    while written < ENDLESS_LINE_LIMIT {
        if alive(pid) {
            peak = peak.max(proc_status_kib(pid, "VmRSS"));
        }
        if sink.write_all(&chunk).is_err() {
            break;
        }
        written += chunk.len();
    }
    (written, peak)
}

#[test]
fn stdio_refuses_a_line_above_max_message_bytes_without_buffering_it() {
    use std::io::{BufRead, Read, Write};
    let mut child = crate::common::server_command(BIN)
        .args(["--listen", "stdio", "--max-message-bytes", "1048576"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let init = json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}});
    stdin.write_all(format!("{init}\n").as_bytes()).unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("sessionId"), "{line}");
    let (written, peak_kib) = write_endless_line(&mut stdin, pid);
    assert!(
        written < ENDLESS_LINE_LIMIT,
        "the server took all {written} bytes of one line"
    );
    assert!(peak_kib < 64 * 1024, "server RSS reached {peak_kib} KiB");
    eprintln!("stdio: refused after {written} bytes; RSS at most {peak_kib} KiB");
    // The one stdio connection ended, so the server exits cleanly and says why.
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("--max-message-bytes"), "{log}");
}

#[tokio::test]
async fn unix_socket_refuses_a_line_above_max_message_bytes_and_keeps_serving() {
    use std::io::{BufRead, Write};
    let d = tmpdir("unix-line");
    let sock = d.join("s.sock");
    let mut child = crate::common::server_command(BIN)
        .args(["--max-message-bytes", "1048576", "--listen"])
        .arg(format!("unix://{}", sock.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let url = first_stdout_line(&mut child);
    let s = Server { child, url };
    let pid = s.pid();
    let (written, peak_kib) = tokio::task::spawn_blocking({
        let sock = sock.clone();
        move || {
            let mut conn = std::os::unix::net::UnixStream::connect(sock).unwrap();
            write_endless_line(&mut conn, pid)
        }
    })
    .await
    .unwrap();
    assert!(written < ENDLESS_LINE_LIMIT, "took {written} bytes");
    assert!(peak_kib < 64 * 1024, "server RSS reached {peak_kib} KiB");
    // Still up: a new connection completes a request.
    let mut conn = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let init = json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}});
    conn.write_all(format!("{init}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    std::io::BufReader::new(conn).read_line(&mut reply).unwrap();
    assert!(reply.contains("sessionId"), "{reply}");
    assert!(alive(pid));
}

#[tokio::test]
async fn connections_that_never_initialize_free_their_slot() {
    let s = Server::start(&["--max-connections", "4"]);
    // One real client, then three upgraded sockets that never finish the
    // JSON-RPC handshake: silent, `initialize` without `initialized`, garbage.
    let mut real = Conn::open(&s.url, None).await;
    let mut idle = Vec::new();
    for first in [
        None,
        Some(json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}).to_string()),
        Some("not json".to_string()),
    ] {
        let mut c = Conn::connect(&s.url).await;
        if let Some(text) = first {
            c.send_raw(text).await;
        }
        idle.push(c);
    }
    match tokio_tungstenite::connect_async(&s.url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503)
        }
        other => panic!("fifth connection: {:?}", other.map(|_| ())),
    }
    // The handshake timeout (10 s) closes each of them and frees its slot…
    for (i, c) in idle.iter_mut().enumerate() {
        assert!(
            c.closed_within(Duration::from_secs(20)).await,
            "idle connection {i} still open"
        );
    }
    let mut c = Conn::open(&s.url, None).await;
    assert_eq!(
        c.ok("environment/status", Value::Null).await["status"],
        "ready"
    );
    // …but never cuts a client that completed it, however quiet since.
    assert_eq!(
        real.ok("environment/status", Value::Null).await["status"],
        "ready"
    );
}

/// The next `fs/changed` of `watch` naming `path` (a `file://` URI).
async fn changed(c: &mut Conn, watch: &str, path: &str) -> Option<Value> {
    changed_but(c, watch, path, "").await
}

/// The next `fs/changed` of `watch` naming `path` whose kind is not `skip`
/// (one write can report `modify` more than once).
async fn changed_but(c: &mut Conn, watch: &str, path: &str, skip: &str) -> Option<Value> {
    c.expect(
        |m| {
            m["method"] == "fs/changed"
                && m["params"]["watchId"] == watch
                && m["params"]["kind"] != skip
                && m["params"]["paths"]
                    .as_array()
                    .is_some_and(|p| p.contains(&json!(path)))
        },
        WAIT,
    )
    .await
}

#[tokio::test]
async fn watches_of_all_sessions_share_one_inotify_instance() {
    let s = Server::start(&[]);
    let pid = s.pid();
    let d = tmpdir("watch-share");
    let dirs: Vec<_> = (0..64)
        .map(|i| {
            let p = d.join(format!("d{i}"));
            std::fs::create_dir(&p).unwrap();
            p
        })
        .collect();
    let (mut a, mut b) = (
        Conn::open(&s.url, None).await,
        Conn::open(&s.url, None).await,
    );
    let (fds, threads) = (fd_count(pid), thread_count(pid));
    // Two sessions, 64 watches each, on the same 64 directories.
    for c in [&mut a, &mut b] {
        for (i, p) in dirs.iter().enumerate() {
            c.ok(
                "fs/watch",
                json!({"watchId": format!("w{i}"), "path": uri(p)}),
            )
            .await;
        }
    }
    assert_eq!(inotify_count(pid), 1, "one inotify instance for the server");
    // One kernel watch per directory, and one for their common parent.
    assert_eq!(inotify_watch_count(pid), 65);
    let (fds_after, threads_after) = (fd_count(pid), thread_count(pid));
    eprintln!("128 watches: fds {fds} -> {fds_after}, threads {threads} -> {threads_after}");
    assert!(fds_after <= fds + 2, "fds {fds} -> {fds_after}");
    assert!(
        threads_after <= threads + 2,
        "threads {threads} -> {threads_after}"
    );
    // Each session hears about a change under its own watch id…
    std::fs::write(dirs[63].join("x"), "1").unwrap();
    let x = uri(&dirs[63].join("x"));
    for c in [&mut a, &mut b] {
        assert!(changed(c, "w63", &x).await.is_some());
    }
    // …and one session's unwatch leaves the other's watch working.
    a.ok("fs/unwatch", json!({"watchId": "w63"})).await;
    std::fs::write(dirs[63].join("y"), "2").unwrap();
    assert!(changed(&mut b, "w63", &uri(&dirs[63].join("y")))
        .await
        .is_some());
    // Unwatching everything removes every kernel watch.
    for c in [&mut a, &mut b] {
        for i in 0..64 {
            c.ok("fs/unwatch", json!({"watchId": format!("w{i}")}))
                .await;
        }
    }
    assert_eq!(inotify_watch_count(pid), 0);
    assert!(alive(pid));
}

#[tokio::test]
async fn watch_survives_replacement_and_ends_with_a_notice() {
    let s = Server::start(&[]);
    let d = tmpdir("watch-replace");
    let mut c = Conn::open(&s.url, None).await;
    // Everything exists before the first watch, so no event predates a watch.
    let (f, sub, holder) = (d.join("f.txt"), d.join("sub"), d.join("holder"));
    std::fs::write(&f, "v1").unwrap();
    std::fs::create_dir(&sub).unwrap();
    std::fs::create_dir(&holder).unwrap();
    std::fs::write(holder.join("g.txt"), "g").unwrap();
    // A file replaced by an atomic save (write a temporary file, rename it over).
    c.ok("fs/watch", json!({"watchId": "file", "path": uri(&f)}))
        .await;
    for round in 0..3 {
        let tmp = d.join(format!(".f.txt.{round}.tmp"));
        std::fs::write(&tmp, format!("v{round}")).unwrap();
        std::fs::rename(&tmp, &f).unwrap();
        let n = changed_but(&mut c, "file", &uri(&f), "modify")
            .await
            .unwrap_or_else(|| panic!("no change after atomic save {round}"));
        assert_eq!(n["params"]["kind"], "rename", "{n}");
        // Written in place afterwards: still heard.
        std::fs::write(&f, format!("edit {round}")).unwrap();
        let n = changed(&mut c, "file", &uri(&f))
            .await
            .unwrap_or_else(|| panic!("silent after atomic save {round}"));
        assert_eq!(n["params"]["kind"], "modify", "{n}");
    }
    // A directory removed and made again.
    c.ok("fs/watch", json!({"watchId": "dir", "path": uri(&sub)}))
        .await;
    std::fs::remove_dir_all(&sub).unwrap();
    let n = changed(&mut c, "dir", &uri(&sub)).await.expect("removal");
    assert_eq!(n["params"]["kind"], "remove");
    std::fs::create_dir(&sub).unwrap();
    let n = changed(&mut c, "dir", &uri(&sub))
        .await
        .expect("re-creation");
    assert_eq!(n["params"]["kind"], "create");
    std::fs::write(sub.join("inside.txt"), "x").unwrap();
    assert!(changed(&mut c, "dir", &uri(&sub.join("inside.txt")))
        .await
        .is_some());
    // When the directory holding the path goes, the watch ends, says so once,
    // and its id is free again; the other watches go on.
    c.ok(
        "fs/watch",
        json!({"watchId": "gone", "path": uri(&holder.join("g.txt"))}),
    )
    .await;
    std::fs::remove_dir_all(&holder).unwrap();
    let n = c
        .expect(|m| m["method"] == "fs/watchEnded", WAIT)
        .await
        .expect("fs/watchEnded");
    assert_eq!(n["params"]["watchId"], "gone");
    assert!(n["params"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("removed")));
    c.ok("fs/watch", json!({"watchId": "gone", "path": uri(&d)}))
        .await;
    std::fs::write(&f, "last").unwrap();
    assert!(changed(&mut c, "file", &uri(&f)).await.is_some());
    assert!(c
        .expect(
            |m| m["method"] == "fs/watchEnded",
            Duration::from_millis(300)
        )
        .await
        .is_none());
    // A recursive watch follows new directories and directories moved within it.
    c.ok(
        "fs/watch",
        json!({"watchId": "tree", "path": uri(&d), "recursive": true}),
    )
    .await;
    let deep = d.join("deep");
    std::fs::create_dir(&deep).unwrap();
    assert!(changed(&mut c, "tree", &uri(&deep)).await.is_some());
    std::fs::create_dir(deep.join("er")).unwrap();
    assert!(changed(&mut c, "tree", &uri(&deep.join("er")))
        .await
        .is_some());
    let moved = d.join("moved");
    std::fs::rename(&deep, &moved).unwrap();
    assert!(changed(&mut c, "tree", &uri(&moved)).await.is_some());
    std::fs::write(moved.join("er/z"), "z").unwrap();
    assert!(changed(&mut c, "tree", &uri(&moved.join("er/z")))
        .await
        .is_some());
}

/// Sets `pid`'s soft limit on open files; returns the previous limits.
fn set_nofile_soft(pid: u32, soft: u64) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit reads `new` and writes `old`, both valid for the call.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0);
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0);
    old
}

#[tokio::test]
async fn watch_without_inotify_resources_says_so_and_recovers() {
    let s = Server::start(&[]);
    let pid = s.pid();
    let d = tmpdir("watch-limit");
    let mut c = Conn::open(&s.url, None).await;
    // No descriptor to spare: the inotify instance cannot be made.
    let old = set_nofile_soft(pid, 0);
    let why = internal_error(&mut c, "fs/watch", json!({"watchId": "w", "path": uri(&d)})).await;
    set_nofile_soft(pid, old.rlim_cur);
    assert!(why.contains("max_user_instances"), "{why}");
    // Not remembered: with descriptors again, the same watch works.
    c.ok("fs/watch", json!({"watchId": "w", "path": uri(&d)}))
        .await;
    std::fs::write(d.join("n"), "1").unwrap();
    assert!(changed(&mut c, "w", &uri(&d.join("n"))).await.is_some());
}
