//! Transparent TCP (`proxy.transparentTcp`, `--linux-sandbox-transparent-tcp`,
//! `--tcp-upstream-proxy`): raw connects of a program that ignores the proxy
//! variables, inside an enforced sandbox, decided by the proxy's policy.

use super::*;

/// A raw TCP echo server: returns its port and the count of connections
/// it accepted.
async fn echo(
    ip: &str,
) -> (
    u16,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, task, accepted)
}

/// A program that ignores every proxy variable: connects straight to
/// `ip:port`, sends `ping`, prints `TAG got <reply>` or `TAG err <errno>`;
/// once connected, connects again and prints `TAG again <errno>`.
fn raw_tcp(tag: &str, ip: &str, port: u16) -> String {
    let py = [
        "import socket".to_string(),
        "try:".into(),
        format!(" s = socket.create_connection((\"{ip}\", {port}), timeout=5)"),
        " s.sendall(b\"ping\")".into(),
        format!(" print(\"{tag} got\", s.recv(100).decode())"),
        "except OSError as e:".into(),
        format!(" print(\"{tag} err\", e.errno)"),
        "else:".into(),
        " try:".into(),
        format!("  s.connect((\"{ip}\", {port}))"),
        " except OSError as e:".into(),
        format!("  print(\"{tag} again\", e.errno)"),
    ];
    format!("python3 -c '{}'", py.join("\n"))
}

/// A one-shot-per-connection HTTP CONNECT proxy on 127.0.0.1: records each
/// request line and tunnels to the named destination.
async fn connect_proxy() -> (
    u16,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
                    match s.read_u8().await {
                        Ok(b) => head.push(b),
                        Err(_) => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(line.clone());
                let Some(target) = line
                    .strip_prefix("CONNECT ")
                    .and_then(|r| r.split(' ').next())
                else {
                    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(target).await else {
                    let _ = s.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = s
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    (port, task, seen)
}

#[tokio::test]
async fn transparent_tcp_carries_raw_connects_through_the_policy() {
    private_internet();
    let st = Command::new("ip")
        .args(["addr", "add", "1.1.1.1/32", "dev", "lo"])
        .status()
        .expect("ip");
    assert!(st.success());
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("ttcp");
    let (allowed, t1, allowed_n) = echo("8.8.8.8").await;
    let (denied, t2, denied_n) = echo("8.8.4.4").await;
    let (asked, t3, asked_n) = echo("1.1.1.1").await;
    let (http, t4, _) = upstream("8.8.8.8").await;
    let script = [
        raw_tcp("allowed", "8.8.8.8", allowed),
        raw_tcp("denied", "8.8.4.4", denied),
        raw_tcp("asked1", "1.1.1.1", asked),
        raw_tcp("asked2", "1.1.1.1", asked),
        // From a thread other than the main one (the notification names the thread).
        format!(
            "python3 -c 'import socket,threading\ndef f():\n s=socket.create_connection((\"8.8.8.8\",{allowed}),timeout=5); \
             s.sendall(b\"ping\"); print(\"thread got\", s.recv(100).decode())\n\
             t=threading.Thread(target=f); t.start(); t.join()'"
        ),
        format!("curl -sS --max-time 5 --noproxy '*' http://8.8.8.8:{http}/; echo; echo curl=$?"),
    ]
    .join("; ");
    let np = json!({"proxy": proxy(json!({"transparentTcp": true,
        "domains": {"8.8.8.8": "allow", "8.8.4.4": "deny"}})), "policyDecisionTimeoutMs": 5000});
    let started = Instant::now();
    let o = run_proxied(
        &mut c,
        "ttcp",
        &f.ws,
        &script,
        np,
        Some(ww(&f.ws)),
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert!(o.out.contains("allowed got ping"), "{o:?}");
    assert!(o.out.contains("thread got ping"), "{o:?}");
    assert!(
        o.out.contains(&format!("allowed again {}", libc::EISCONN)),
        "a carried socket is connected for the program too: {o:?}"
    );
    assert!(
        o.out
            .contains(&format!("denied err {}", libc::ECONNREFUSED)),
        "a denied destination is refused: {o:?}"
    );
    assert!(
        o.out.contains("asked1 got ping") && o.out.contains("asked2 got ping"),
        "{o:?}"
    );
    assert!(
        o.out.contains("hello from 8.8.8.8") && o.out.contains("curl=0"),
        "{o:?}"
    );
    assert_eq!(o.requests.len(), 1, "one policyRequest: {:?}", o.requests);
    assert_eq!(
        o.requests[0]["params"]["request"],
        json!({"protocol": "socks5_tcp", "host": "1.1.1.1", "port": asked})
    );
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(allowed_n.load(SeqCst), 2);
    assert_eq!(denied_n.load(SeqCst), 0, "the denied upstream saw nothing");
    assert_eq!(asked_n.load(SeqCst), 2);
    assert!(
        o.audits
            .iter()
            .any(|a| a["host"] == "8.8.4.4" && a["decision"] == "deny"),
        "{:?}",
        o.audits
    );
    assert_eq!(o.exit, 0, "{o:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for t in [t1, t2, t3, t4] {
        t.abort();
    }
}

#[tokio::test]
async fn tcp_upstream_proxy_carries_transparent_tcp_and_false_keeps_it_blocked() {
    private_internet();
    let (pport, ptask, seen) = connect_proxy().await;
    let upstream_flag = format!("127.0.0.1:{pport}");
    let s = Server::start(&[
        "--linux-sandbox-transparent-tcp",
        "--tcp-upstream-proxy",
        &upstream_flag,
    ]);
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("ttcp-up");
    let (port, task, accepted) = echo("8.8.8.8").await;
    // The flag turns it on for a request that does not say.
    let np = json!({"proxy": proxy(json!({"domains": {"8.8.8.8": "allow"}}))});
    let o = run_proxied(
        &mut c,
        "ttcp-up",
        &f.ws,
        &raw_tcp("via", "8.8.8.8", port),
        np,
        Some(ww(&f.ws)),
        Reply::Silence,
    )
    .await;
    assert!(o.out.contains("via got ping"), "{o:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![format!("CONNECT 8.8.8.8:{port} HTTP/1.1")],
        "the raw connection went through the CONNECT proxy"
    );
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(accepted.load(SeqCst), 1);
    // A request's explicit false wins: raw TCP stays blocked (no route).
    let np = json!({"proxy": proxy(json!({"transparentTcp": false,
        "domains": {"8.8.8.8": "allow"}}))});
    let o = run_proxied(
        &mut c,
        "ttcp-off",
        &f.ws,
        &raw_tcp("off", "8.8.8.8", port),
        np,
        Some(ww(&f.ws)),
        Reply::Silence,
    )
    .await;
    assert!(
        o.out.contains(&format!("off err {}", libc::ENETUNREACH)),
        "{o:?}"
    );
    assert_eq!(
        accepted.load(SeqCst),
        1,
        "nothing more reached the upstream"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    task.abort();
    ptask.abort();
}
